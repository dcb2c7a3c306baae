//! Background threads (the reclaimer, the deleter) run at a lower scheduling priority than
//! the threads that answer requests, so that on a busy machine a lookup waits for a core
//! less often behind eviction work; on an idle machine they still get every free cycle.
//!
//! Invariant: only the calling thread's priority changes (Linux schedules threads, so
//! `setpriority` with a thread id affects that thread alone); a refusal (a sandbox that
//! forbids it) leaves the thread as it was and is logged at debug level.

/// The nice value of background threads (0 is the default, 19 the lowest priority).
pub(crate) const BACKGROUND_NICE: i32 = 10;

/// Lowers the calling thread's priority to [`BACKGROUND_NICE`] (never raises it).
pub(crate) fn lower_priority() {
    // SAFETY: gettid, getpriority and setpriority take no pointers and touch no memory:
    // they read the calling thread's id and read and change its scheduling priority.
    let refused = unsafe {
        let thread = libc::gettid() as libc::id_t;
        let current = libc::getpriority(libc::PRIO_PROCESS, thread);
        libc::setpriority(libc::PRIO_PROCESS, thread, current.max(BACKGROUND_NICE)) != 0
    };
    if refused {
        let error = std::io::Error::last_os_error();
        tracing::debug!(%error, "a background thread keeps its priority");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_calling_thread_is_lowered() {
        // SAFETY: getpriority takes no pointers; 0 names the calling thread.
        let nice = || unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        let before = nice();
        let lowered = std::thread::spawn(move || {
            lower_priority();
            nice()
        })
        .join()
        .expect("thread");
        assert_eq!(
            lowered,
            before.max(BACKGROUND_NICE),
            "the background thread"
        );
        assert_eq!(nice(), before, "the calling thread is untouched");
    }
}
