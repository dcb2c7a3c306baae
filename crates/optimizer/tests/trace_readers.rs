//! Trace readers on real files: every format, every bad-input path, and the event-log writer
//! with rotation read back by the reader.

use std::fs;
use std::path::{Path, PathBuf};

use kvcm_optimizer::model::Workload;
use kvcm_optimizer::trace::events::{Event, EventLogWriter, EventType, EVENT_LOG_VERSION};
use kvcm_optimizer::trace::{Request, TraceError, TraceFormat, TraceReader};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/optimizer")
        .join(name)
}

fn read_all(path: &Path, format: Option<TraceFormat>) -> Result<Vec<Request>, TraceError> {
    TraceReader::open(path, format)?.collect()
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, text).unwrap();
    path
}

/// The line number and message of a line error.
fn line_error(result: Result<Vec<Request>, TraceError>) -> (usize, String) {
    match result {
        Err(TraceError::Line { line, message, .. }) => (line, message),
        other => panic!("expected a line error, got {other:?}"),
    }
}

#[test]
fn every_format_reads_the_same_requests() {
    let expected_blocks: Vec<Vec<u64>> = vec![
        vec![1, 2, 3],
        vec![1, 2, 4],
        vec![1, 2, 3],
        vec![5, 6],
        vec![1, 2, 3],
    ];
    for (name, format, block_tokens) in [
        ("mooncake_small.jsonl", TraceFormat::Mooncake, 512),
        ("bailian_small.jsonl", TraceFormat::Bailian, 16),
        ("events_small.jsonl", TraceFormat::Events, 16),
        ("native_small.jsonl", TraceFormat::Native, 16),
    ] {
        let path = fixture(name);
        let reader = TraceReader::open(&path, None).unwrap();
        assert_eq!(reader.format(), format, "{name}");
        let requests: Vec<Request> = reader.collect::<Result<_, _>>().unwrap();
        let blocks: Vec<Vec<u64>> = requests.iter().map(|r| r.blocks.clone()).collect();
        assert_eq!(blocks, expected_blocks, "{name}");
        assert_eq!(
            requests[1].timestamp_us - requests[0].timestamp_us,
            1_000_000
        );
        let workload = Workload::load(&[path], None, None).unwrap();
        assert_eq!(workload.block_tokens(), block_tokens, "{name}");
        assert_eq!(workload.unique_blocks(), 6, "{name}");
    }
}

#[test]
fn event_log_defaults_input_tokens_to_whole_blocks() {
    let requests = read_all(&fixture("events_small.jsonl"), None).unwrap();
    assert_eq!(requests[0].input_tokens, 47);
    assert_eq!(requests[3].input_tokens, 32);
    assert_eq!(requests[3].instance, "inst-a");
}

#[test]
fn truncated_and_wrong_typed_lines_name_file_and_line() {
    let truncated = TraceReader::open(&fixture("bad/truncated.jsonl"), None)
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap_err();
    let text = truncated.to_string();
    assert!(
        text.contains("truncated.jsonl:3: EOF while parsing"),
        "{text}"
    );
    let (line, message) = line_error(read_all(&fixture("bad/wrong_type.jsonl"), None));
    assert_eq!(line, 2);
    assert!(message.contains("invalid type: string"), "{message}");
}

#[test]
fn empty_blank_and_unknown_files_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    for path in [
        fixture("bad/empty.jsonl"),
        write(dir.path(), "blank.jsonl", "\n  \n\n"),
    ] {
        let error = TraceReader::open(&path, None).err().unwrap();
        assert!(matches!(error, TraceError::Empty { .. }), "{error}");
    }
    let error = TraceReader::open(&fixture("bad/unknown_format.jsonl"), None)
        .err()
        .unwrap();
    assert!(
        error
            .to_string()
            .contains("unknown_format.jsonl:1: cannot detect"),
        "{error}"
    );
    let no_log = Workload::load(&[dir.path().to_path_buf()], None, None).unwrap_err();
    assert!(matches!(no_log, TraceError::NoEventLog { .. }), "{no_log}");
    let missing = TraceReader::open(&dir.path().join("missing.jsonl"), None)
        .err()
        .unwrap();
    assert!(matches!(missing, TraceError::Io { .. }), "{missing}");
}

#[test]
fn header_only_native_trace_is_empty() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "n.jsonl",
        "{\"kvcm_trace\": 1, \"block_tokens\": 16}\n",
    );
    let error = read_all(&path, None).unwrap_err();
    assert!(matches!(error, TraceError::Empty { .. }), "{error}");
}

#[test]
fn bad_values_are_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            TraceFormat::Mooncake,
            "{\"timestamp\": -5, \"input_length\": 1, \"hash_ids\": [1]}\n",
            1,
            "timestamp -5",
        ),
        (
            TraceFormat::Mooncake,
            "{\"timestamp\": 1, \"input_length\": 1, \"hash_ids\": [-1]}\n",
            1,
            "invalid value: integer `-1`",
        ),
        (
            TraceFormat::Bailian,
            "{\"timestamp\": 1.5, \"input_length\": 1, \"hash_ids\": [1]}\n",
            1,
            "missing field `chat_id`",
        ),
        (
            TraceFormat::Native,
            "{\"ts_us\": 1, \"tokens\": 1, \"blocks\": [1]}\n",
            1,
            "expected the native header line",
        ),
        (
            TraceFormat::Native,
            "{\"kvcm_trace\": 2, \"block_tokens\": 16}\n",
            1,
            "unsupported native trace version 2",
        ),
        (
            TraceFormat::Events,
            "{\"v\":1,\"ts_us\":1,\"event\":\"get_cache_location\",\"instance\":\"a\",\"keys\":[1]}\n",
            1,
            "without block_tokens",
        ),
        (
            TraceFormat::Events,
            "{\"v\":1,\"ts_us\":1,\"event\":\"get_cache_location\",\"instance\":\"a\",\"keys\":[1],\"block_tokens\":16}\n\n{\"v\":1,\"ts_us\":2,\"event\":\"get_cache_location\",\"instance\":\"a\",\"keys\":[1],\"block_tokens\":32}\n",
            3,
            "block_tokens 32 differs from 16",
        ),
        (
            TraceFormat::Events,
            "{\"v\":1,\"ts_us\":1,\"event\":\"evict_all\",\"instance\":\"a\",\"keys\":[]}\n",
            1,
            "unknown variant `evict_all`",
        ),
        (
            TraceFormat::Events,
            "{\"v\":2,\"ts_us\":1,\"event\":\"reclaim\",\"instance\":\"a\",\"keys\":[]}\n",
            1,
            "unsupported event log version 2",
        ),
    ];
    for (index, (format, text, line, message)) in cases.into_iter().enumerate() {
        let path = write(dir.path(), &format!("case{index}.jsonl"), text);
        let (got_line, got_message) = line_error(read_all(&path, Some(format)));
        assert_eq!(got_line, line, "case {index}");
        assert!(got_message.contains(message), "case {index}: {got_message}");
    }
}

#[test]
fn non_utf8_line_is_a_line_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("latin1.jsonl");
    let mut bytes = b"{\"timestamp\": 0, \"input_length\": 1, \"hash_ids\": [1]}\n".to_vec();
    bytes.extend_from_slice(b"{\"timestamp\": \xff}\n");
    fs::write(&path, bytes).unwrap();
    let (line, message) = line_error(read_all(&path, None));
    assert_eq!((line, message.as_str()), (2, "line is not valid UTF-8"));
}

fn get_event(ts_us: u64, keys: Vec<u64>) -> Event {
    Event {
        v: EVENT_LOG_VERSION,
        ts_us,
        event: EventType::GetCacheLocation,
        instance: "inst-a".to_string(),
        keys,
        block_tokens: Some(64),
        input_tokens: None,
        write_session: None,
    }
}

#[test]
fn event_log_writer_rotates_by_size_and_replays_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = EventLogWriter::open(dir.path(), 300, 2).unwrap();
    for i in 0..12u64 {
        writer.write(&get_event(i, vec![i, i + 1])).unwrap();
    }
    writer.flush().unwrap();
    let files = EventLogWriter::files_oldest_first(dir.path());
    let names: Vec<String> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["events.2.jsonl", "events.1.jsonl", "events.jsonl"]);
    for file in &files {
        assert!(fs::metadata(file).unwrap().len() <= 300, "{file:?}");
    }
    let timestamps: Vec<u64> = files
        .iter()
        .flat_map(|f| read_all(f, None).unwrap())
        .map(|r| r.timestamp_us)
        .collect();
    // Oldest files were dropped; what is left is the most recent, contiguous and in order.
    assert_eq!(*timestamps.last().unwrap(), 11);
    assert!(
        timestamps.windows(2).all(|w| w[1] == w[0] + 1),
        "{timestamps:?}"
    );
    assert!(timestamps.len() < 12);
    let workload = Workload::load(&files, None, None).unwrap();
    assert_eq!(workload.block_tokens(), 64);
    let from_dir = Workload::load(&[dir.path().to_path_buf()], None, None).unwrap();
    assert_eq!(from_dir.accesses(), workload.accesses());
    assert_eq!(from_dir.timestamp_us(0), timestamps[0]);
}

#[test]
fn event_log_writer_appends_to_an_existing_log() {
    let dir = tempfile::tempdir().unwrap();
    for ts in [1, 2] {
        let mut writer = EventLogWriter::open(dir.path(), 1 << 20, 3).unwrap();
        writer.write(&get_event(ts, vec![7])).unwrap();
        writer.flush().unwrap();
    }
    let requests = read_all(&dir.path().join("events.jsonl"), None).unwrap();
    assert_eq!(
        requests.iter().map(|r| r.timestamp_us).collect::<Vec<_>>(),
        [1, 2]
    );
}

#[test]
fn trace_files_implying_different_block_sizes_are_rejected_by_name() {
    // Mooncake implies 512 tokens per block; the native fixture declares 16.
    let mooncake = fixture("mooncake_small.jsonl");
    let native = fixture("native_small.jsonl");
    let error = Workload::load(&[mooncake.clone(), native.clone()], None, None).unwrap_err();
    match &error {
        TraceError::BlockTokensMismatch {
            path,
            found,
            expected,
        } => assert_eq!((path, *found, *expected), (&native, 16, 512)),
        other => panic!("expected a block-size mismatch, got {other:?}"),
    }
    assert!(error
        .to_string()
        .contains("native_small.jsonl: implies 16 tokens per block"));
    // Files that agree load together; --block-tokens overrides the disagreement.
    let twice = Workload::load(&[mooncake.clone(), mooncake.clone()], None, None).unwrap();
    assert_eq!(twice.block_tokens(), 512);
    let forced = Workload::load(&[mooncake, native], None, Some(64)).unwrap();
    assert_eq!(forced.block_tokens(), 64);
}
