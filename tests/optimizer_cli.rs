//! `kvcm optimize` end to end: runs the real binary on hand-made traces and the Mooncake
//! fixture, and checks its table, its output files and its errors.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/optimizer")
        .join(name)
}

fn mooncake_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/mooncake_synthetic_trace.jsonl")
}

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "kvcm-optimizer-cli-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let path = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn optimize(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvcm"))
        .arg("optimize")
        .args(args)
        .output()
        .unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A successful run: its stdout and its output directory.
struct Run {
    stdout: String,
    out: TempDir,
}

impl Run {
    fn file(&self, name: &str) -> String {
        std::fs::read_to_string(self.out.0.join(name)).unwrap()
    }

    fn rates(&self) -> Vec<(String, usize, f64, f64)> {
        csv_rates(&self.file("results.csv"))
    }
}

/// Runs `kvcm optimize --trace <trace> <args> --out <fresh dir>`; asserts it succeeded.
fn optimize_ok(trace: &Path, args: &[&str]) -> Run {
    let out = TempDir::new();
    let mut all = vec!["--trace", trace.to_str().unwrap()];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--out", out.0.to_str().unwrap()]);
    let output = optimize(&all);
    assert!(output.status.success(), "{trace:?}: {}", stderr(&output));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    Run { stdout, out }
}

/// `policy,capacity -> (block_hit_rate, token_hit_rate)` from results.csv.
fn csv_rates(csv: &str) -> Vec<(String, usize, f64, f64)> {
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(
        header[..4],
        [
            "policy",
            "capacity_blocks",
            "block_hit_rate",
            "token_hit_rate"
        ]
    );
    lines
        .map(|line| {
            let cells: Vec<&str> = line.split(',').collect();
            (
                cells[0].to_string(),
                cells[1].parse().unwrap(),
                cells[2].parse().unwrap(),
                cells[3].parse().unwrap(),
            )
        })
        .collect()
}

#[test]
fn hand_made_trace_gives_hand_computed_rates_and_all_outputs() {
    let trace = fixture("mooncake_small.jsonl");
    let run = optimize_ok(&trace, &["--policy", "lru,fifo", "--capacity", "50%,6"]);
    // LRU at 3 blocks: requests 2 and 3 hit [1,2]: 4 of 14 blocks, 2048 of 6996 tokens.
    // FIFO at 3 blocks: only request 2 hits [1,2]. At 6 blocks nothing is evicted:
    // 2 + 3 + 3 = 8 of 14 blocks, 1024 + 1400 + 1536 = 3960 of 6996 tokens.
    let rates = run.rates();
    let expected = [
        ("lru", 3, 4.0 / 14.0, 2048.0 / 6996.0),
        ("lru", 6, 8.0 / 14.0, 3960.0 / 6996.0),
        ("fifo", 3, 2.0 / 14.0, 1024.0 / 6996.0),
        ("fifo", 6, 8.0 / 14.0, 3960.0 / 6996.0),
    ];
    assert_eq!(rates.len(), expected.len());
    for ((policy, capacity, block, token), row) in expected.iter().zip(&rates) {
        assert_eq!((policy.to_string(), *capacity), (row.0.clone(), row.1));
        assert!(
            (block - row.2).abs() < 1e-6 && (token - row.3).abs() < 1e-6,
            "{row:?}"
        );
    }
    let stdout = &run.stdout;
    let printed_row = ["lru", "3", "0.2857", "0.2927"];
    assert!(
        stdout
            .lines()
            .any(|line| line.split_whitespace().take(4).eq(printed_row)),
        "{stdout}"
    );
    for name in [
        "hit_rate_vs_capacity",
        "hit_rate_over_time",
        "reuse_distance",
    ] {
        let png = std::fs::read(run.out.0.join(format!("{name}.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{name}");
        let svg = run.file(&format!("{name}.svg"));
        assert!(
            svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
            "{name}"
        );
    }
    let json = run.file("results.json");
    assert!(json.contains("\"unique_blocks\": 6") && json.contains("\"lru_curve\""));
}

#[test]
fn every_format_of_the_same_workload_gives_the_same_block_hit_rates() {
    let mut all = Vec::new();
    for name in [
        "mooncake_small.jsonl",
        "bailian_small.jsonl",
        "events_small.jsonl",
        "native_small.jsonl",
    ] {
        let args = ["--policy", "lru,s3fifo,sieve,belady", "--capacity", "2,3,4"];
        let run = optimize_ok(&fixture(name), &args);
        let blocks: Vec<(String, usize, f64)> =
            run.rates().into_iter().map(|r| (r.0, r.1, r.2)).collect();
        all.push(blocks);
    }
    assert!(all.windows(2).all(|w| w[0] == w[1]), "{all:?}");
}

#[test]
fn fixture_lru_sweep_meets_the_acceptance_figures() {
    let args = [
        "--policy",
        "lru",
        "--capacity",
        "5%,10%,20%,40%,60%,80%,100%",
    ];
    let rates = optimize_ok(&mooncake_fixture(), &args).rates();
    let expected = [
        (2_196, 0.1548),
        (4_392, 0.2598),
        (8_784, 0.3905),
        (17_569, 0.5446),
        (26_354, 0.6124),
        (35_139, 0.6353),
        (43_924, 0.6396),
    ];
    for ((capacity, rate), row) in expected.iter().zip(&rates) {
        assert_eq!(row.1, *capacity);
        assert!((row.2 - rate).abs() <= 0.0005, "{row:?}");
    }
}

#[test]
fn two_tier_run_reports_writes_per_tier() {
    let trace = fixture("mooncake_small.jsonl");
    let run = optimize_ok(&trace, &["--capacity", "4", "--memory-tier", "1"]);
    let csv = run.file("results.csv");
    let row: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
    assert_eq!(row[4], "1", "memory_tier_blocks: {csv}");
    let (written_main, written_memory): (u64, u64) =
        (row[10].parse().unwrap(), row[11].parse().unwrap());
    assert!(written_memory >= 7 && written_main > 0, "{csv}");
}

#[test]
fn bad_inputs_fail_with_a_message_naming_the_line() {
    let cases = [
        ("bad/truncated.jsonl", "truncated.jsonl:3:"),
        ("bad/wrong_type.jsonl", "wrong_type.jsonl:2: invalid type"),
        ("bad/empty.jsonl", "trace is empty"),
        (
            "bad/unknown_format.jsonl",
            "unknown_format.jsonl:1: cannot detect the trace format",
        ),
    ];
    for (name, message) in cases {
        let trace = fixture(name);
        let output = optimize(&["--trace", trace.to_str().unwrap()]);
        assert!(!output.status.success(), "{name}");
        assert!(
            stderr(&output).contains(message),
            "{name}: {}",
            stderr(&output)
        );
    }
}

#[test]
fn bad_arguments_fail_with_a_clear_error() {
    let trace = fixture("mooncake_small.jsonl");
    let trace = trace.to_str().unwrap();
    let cases: [(&[&str], &str); 5] = [
        (
            &["--format", "parquet"],
            "invalid value 'parquet' for '--format",
        ),
        (
            &["--policy", "clock"],
            "invalid value 'clock' for '--policy",
        ),
        (&["--capacity", "5%,ten"], "invalid capacity \"ten\""),
        (&["--capacity", "1GiB"], "pass --bytes-per-token"),
        (&["--target", "1.5"], "--target must be in (0, 1]"),
    ];
    for (args, message) in cases {
        let mut all = vec!["--trace", trace];
        all.extend_from_slice(args);
        let output = optimize(&all);
        assert!(!output.status.success(), "{args:?}");
        assert!(
            stderr(&output).contains(message),
            "{args:?}: {}",
            stderr(&output)
        );
    }
}

#[test]
fn traces_implying_different_block_sizes_fail_naming_the_file() {
    let mooncake = fixture("mooncake_small.jsonl");
    let native = fixture("native_small.jsonl");
    let (mooncake, native) = (mooncake.to_str().unwrap(), native.to_str().unwrap());
    let output = optimize(&["--trace", mooncake, native]);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("native_small.jsonl: implies 16 tokens per block, but the trace files before it imply 512"),
        "{}",
        stderr(&output)
    );
    let forced = optimize(&["--trace", mooncake, native, "--block-tokens", "16"]);
    assert!(forced.status.success(), "{}", stderr(&forced));
}

#[test]
fn a_rotated_event_log_directory_replays_like_the_single_file() {
    use kvcm_optimizer::trace::events::{Event, EventLogWriter, EventType, EVENT_LOG_VERSION};
    let log = TempDir::new();
    let mut writer = EventLogWriter::open(&log.0, 400, 10).unwrap();
    let requests: [&[u64]; 5] = [&[1, 2, 3], &[1, 2, 4], &[1, 2, 3], &[5, 6], &[1, 2, 3]];
    for (i, keys) in requests.iter().enumerate() {
        let event = Event {
            v: EVENT_LOG_VERSION,
            ts_us: i as u64 * 1_000_000,
            event: EventType::GetCacheLocation,
            instance: "inst-a".to_string(),
            keys: keys.to_vec(),
            block_tokens: Some(512),
            input_tokens: None,
            write_session: None,
        };
        writer.write(&event).unwrap();
    }
    writer.flush().unwrap();
    assert!(
        log.0.join("events.1.jsonl").exists(),
        "the log did not rotate"
    );
    let rates = |trace: &Path| {
        let run = optimize_ok(trace, &["--capacity", "3,6"]);
        run.rates().into_iter().map(|r| r.2).collect::<Vec<f64>>()
    };
    assert_eq!(rates(&log.0), rates(&fixture("mooncake_small.jsonl")));
}

#[test]
fn an_output_path_that_is_a_file_fails_with_its_name() {
    let trace = fixture("mooncake_small.jsonl");
    let output = optimize(&[
        "--trace",
        trace.to_str().unwrap(),
        "--out",
        trace.to_str().unwrap(),
    ]);
    assert!(!output.status.success());
    let message = stderr(&output);
    assert!(
        message.contains("cannot write") && message.contains("mooncake_small.jsonl"),
        "{message}"
    );
}
