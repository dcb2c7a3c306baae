//! The event log against real files: order, drops, close.

use std::sync::mpsc;

use kvcm_optimizer::trace::events::{Event, EventLogWriter, EventType};

use super::record::Record;
use super::{EventLog, EventSink};
use crate::logs::{LogError, LogFeed, Message};

fn read_log(dir: &std::path::Path) -> Vec<Event> {
    EventLogWriter::files_oldest_first(dir)
        .iter()
        .flat_map(|path| {
            let text = std::fs::read_to_string(path).expect("read log");
            text.lines()
                .map(|line| serde_json::from_str(line).expect("schema v1 line"))
                .collect::<Vec<Event>>()
        })
        .collect()
}

fn started(session: &str, keys: Vec<i64>) -> Record {
    Record::WriteStarted {
        ts_us: 2,
        instance: "inst".into(),
        keys,
        session: session.into(),
    }
}

fn finished(session: &str, keys: Vec<i64>) -> Record {
    Record::WriteFinished {
        ts_us: 3,
        instance: "inst".into(),
        session: session.into(),
        keys,
    }
}

#[test]
fn records_are_written_in_order_and_finish_carries_the_committed_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = EventLog::start(dir.path(), 1 << 20, 2).expect("start");
    let sink = log.sink();
    sink.emit(Record::Lookup {
        ts_us: 1,
        instance: "inst".into(),
        keys: vec![5, -1],
        block_tokens: 16,
        input_tokens: Some(20),
    });
    sink.emit(started("s1", vec![7, 8, 9]));
    sink.emit(finished("s1", vec![7, 9]));
    log.close().expect("close");

    let events = read_log(dir.path());
    let kinds: Vec<EventType> = events.iter().map(|e| e.event).collect();
    use EventType::*;
    assert_eq!(kinds, [GetCacheLocation, StartWriteCache, FinishWriteCache]);
    assert_eq!(events[0].keys, [5, u64::MAX], "an i64 key keeps its bits");
    assert_eq!(
        (events[0].block_tokens, events[0].input_tokens),
        (Some(16), Some(20))
    );
    assert_eq!(events[1].keys, [7, 8, 9]);
    assert_eq!(events[2].keys, [7, 9]);
    assert_eq!(events[2].write_session.as_deref(), Some("s1"));
    assert_eq!(sink.dropped(), 0);
}

#[test]
fn a_full_channel_drops_without_blocking_and_counts() {
    let (sender, receiver) = mpsc::sync_channel::<Message<Record>>(1);
    let sink = EventSink::new(LogFeed::over(sender));
    sink.emit(started("a", vec![1]));
    sink.emit(started("b", vec![2]));
    sink.emit(started("c", vec![3]));
    assert_eq!(sink.dropped(), 2);
    assert!(matches!(receiver.try_recv(), Ok(Message::Record(_))));
    let text = sink.to_prometheus("kvcm");
    assert!(text.contains("\nkvcm_event_log_dropped 2"), "{text}");
    assert!(sink
        .to_prometheus("")
        .starts_with("# TYPE event_log_dropped counter"));
    assert_eq!(sink.to_wire()[0].metric_name, "event_log.dropped");
}

#[test]
fn records_after_close_are_dropped_and_a_disabled_sink_ignores_everything() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = EventLog::start(dir.path(), 1 << 20, 2).expect("start");
    let sink = log.sink();
    log.close().expect("close");
    sink.emit(started("late", vec![1]));
    assert_eq!(sink.dropped(), 1);
    assert!(read_log(dir.path()).is_empty());

    let disabled = EventLog::disabled().sink();
    disabled.emit(started("x", vec![1]));
    assert!(!disabled.is_enabled());
    assert_eq!(disabled.dropped(), 0);
    assert_eq!(disabled.keys_if_enabled(&[1, 2]), None);
}

#[test]
fn an_unusable_directory_is_an_open_error_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").expect("write");
    let error = EventLog::start(&file, 1024, 1).unwrap_err();
    assert!(matches!(error, LogError::Open { .. }), "{error}");
    assert!(error.to_string().contains("not-a-dir"), "{error}");
}

#[test]
fn close_writes_every_record_accepted_before_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = EventLog::start(dir.path(), 1 << 16, 1_000).expect("start");
    let sink = log.sink();
    for i in 0..10_000 {
        sink.emit(started(&format!("s{i}"), vec![i]));
    }
    log.close().expect("close");
    let keys: Vec<u64> = read_log(dir.path()).iter().map(|e| e.keys[0]).collect();
    assert_eq!(sink.dropped(), 0);
    assert_eq!(keys, (0..10_000).collect::<Vec<u64>>());
}
