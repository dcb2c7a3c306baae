//! Hostile clients run as another, non-root user: a test re-executes its own binary's
//! ignored entry test as uid/gid [`NOBODY`], handing it what it may use through one
//! environment variable; the entry runs its checks and prints [`PASSED`] last.

use std::path::Path;

/// The uid and gid a hostile client runs as.
pub const NOBODY: u32 = 65534;
/// An entry's last line when every check held.
pub const PASSED: &str = "OTHER USER CHECKS PASSED";

/// This process's effective uid.
pub fn euid() -> u32 {
    std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").expect("stat"))
}

/// Why user [`NOBODY`] cannot run `exe`, if it cannot.
fn not_runnable_by_others(exe: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).map(|m| m.permissions().mode());
    exe.ancestors()
        .skip(1)
        .find(|dir| mode(dir).map_or(true, |m| m & 0o001 == 0))
        .map(|dir| format!("{} is not traversable by others", dir.display()))
        .or_else(|| {
            (mode(exe).map_or(true, |m| m & 0o005 != 0o005))
                .then(|| format!("{} is not executable by others", exe.display()))
        })
}

/// True, after a loud skip naming `test`, where a client cannot be run as [`NOBODY`]
/// (this process is not root, or the test binary is out of the other user's reach).
pub fn cannot_run(test: &str) -> bool {
    let skipped = format!("SKIPPED {test}");
    if euid() != 0 {
        super::shout(&format!(
            "{skipped}: it must run as root to start the client as uid {NOBODY}"
        ));
        return true;
    }
    let exe = std::env::current_exe().expect("test binary");
    if let Some(why) = not_runnable_by_others(&exe) {
        super::shout(&format!("{skipped}: {why}"));
        return true;
    }
    false
}

/// Runs this test binary's ignored test `entry` as [`NOBODY`] with `handed` in the
/// environment variable `env`, and asserts that it ran every check.
pub fn run_as_nobody(entry: &str, env: &str, handed: &str) {
    let exe = std::env::current_exe().expect("test binary");
    use std::os::unix::process::CommandExt;
    let client = std::process::Command::new(exe)
        .args([entry, "--exact", "--ignored", "--nocapture"])
        .env(env, handed)
        .uid(NOBODY)
        .gid(NOBODY)
        .output()
        .expect("run the client");
    let output = format!(
        "client stdout:\n{}\nclient stderr:\n{}",
        String::from_utf8_lossy(&client.stdout),
        String::from_utf8_lossy(&client.stderr)
    );
    assert!(client.status.success(), "the client failed\n{output}");
    assert!(
        String::from_utf8_lossy(&client.stdout).contains(PASSED),
        "the client did not run its checks\n{output}"
    );
}

/// Opening `path` fails as a permission error.
pub fn open_is_denied(path: &str) {
    match std::fs::File::open(path) {
        Ok(_) => panic!("{path} opened"),
        Err(e) => assert_eq!(
            e.kind(),
            std::io::ErrorKind::PermissionDenied,
            "{path}: {e}, not a permission error"
        ),
    }
}

/// None of process `pid`'s descriptors 0–255 (and `more`) nor its memory opens through
/// /proc.
pub fn proc_is_closed(pid: u64, more: impl IntoIterator<Item = i32>) {
    for n in (0..256).chain(more) {
        open_is_denied(&format!("/proc/{pid}/fd/{n}"));
    }
    open_is_denied(&format!("/proc/{pid}/mem"));
}
