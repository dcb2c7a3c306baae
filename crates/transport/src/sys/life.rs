//! A process's death made visible in shared memory without a system call, by the kernel's
//! robust-futex list (set_robust_list(2)).
//!
//! The first shared-memory queue pair of a process starts a keeper thread that runs as long
//! as the process does. It writes its thread id into the word at [`WORD`] of a small memfd
//! page and registers that word as its only robust-futex entry. When a thread exits, the
//! kernel walks its robust list and, for every entry whose word holds the thread's id,
//! replaces the word by `FUTEX_OWNER_DIED` (`exit_robust_list`); for a thread that never
//! returns that happens only when the process dies or execs — SIGKILL included. Peers map
//! the page and read the word: one load per batch of direct accesses instead of a poll(2)
//! of a pidfd.
//!
//! Invariants: the list head and its node live in this process's private memory, leaked
//! for the life of the process (the kernel reads them at the keeper's exit); only the word
//! is shared, so a peer that writes the page can at most make its own readers think this
//! process died, never steer the kernel elsewhere. The keeper never locks a robust pthread
//! mutex (its list would have been glibc's otherwise).

use super::SharedMemory;
use crate::{Result, TransportError};
use std::sync::atomic::Ordering;
use std::sync::OnceLock;

// The kernel writes the 32-bit futex word at `WORD`; it is read as the low half of an
// 8-byte atomic, which is where it lies on little-endian machines only.
#[cfg(not(target_endian = "little"))]
compile_error!("sys/life.rs reads the futex word as the low half of a u64 (little-endian)");

/// Bytes of the page peers map.
pub(crate) const PAGE: usize = 4096;
/// Offset of the 32-bit word in the page (the low half of an aligned 8-byte word on the
/// little-endian machines kvcm runs on).
const WORD: usize = 8;
/// What the kernel leaves in the word of a dead owner.
const FUTEX_OWNER_DIED: u64 = 0x4000_0000;

/// `struct robust_list` (linux/futex.h).
#[repr(C)]
struct RobustList {
    next: *const RobustList,
}

/// `struct robust_list_head` (linux/futex.h).
#[repr(C)]
struct RobustListHead {
    list: RobustList,
    futex_offset: libc::c_long,
    list_op_pending: *const RobustList,
}

/// This process's page, once its keeper thread registered it.
static PROCESS_PAGE: OnceLock<std::result::Result<&'static SharedMemory, String>> = OnceLock::new();

/// The page that says whether this process is alive (its keeper thread started on first
/// use); peers get it, read-only, from the descriptor broker of a shared-memory domain.
pub(crate) fn process_page() -> Result<&'static SharedMemory> {
    PROCESS_PAGE
        .get_or_init(start_keeper)
        .clone()
        .map_err(|why| TransportError::io("process liveness page", std::io::Error::other(why)))
}

/// Whether the process owning `page` (a peer's, mapped) still runs.
pub(crate) fn alive(page: &SharedMemory) -> bool {
    page.load_u64(WORD, Ordering::Acquire).is_ok_and(|word| {
        let value = word & 0xffff_ffff;
        value != 0 && value & FUTEX_OWNER_DIED == 0
    })
}

fn start_keeper() -> std::result::Result<&'static SharedMemory, String> {
    let page = SharedMemory::create(c"kvcm-life", PAGE).map_err(|e| e.to_string())?;
    let page: &'static SharedMemory = Box::leak(Box::new(page));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("kvcm-life".into())
        .spawn(move || {
            let registered = register_current_thread(page);
            let ok = registered.is_ok();
            let _ = tx.send(registered);
            if !ok {
                return;
            }
            // Never returns: the word must stay owned until the process ends.
            loop {
                std::thread::park();
            }
        })
        .map_err(|e| format!("spawn the keeper thread: {e}"))?;
    rx.recv()
        .map_err(|_| "the keeper thread died".to_string())??;
    Ok(page)
}

/// Writes the calling thread's id into `page`'s word and makes that word the thread's only
/// robust-futex entry; `page` must stay mapped until the thread exits.
fn register_current_thread(page: &'static SharedMemory) -> std::result::Result<(), String> {
    let word = page.atomic_u64(WORD).map_err(|e| e.to_string())?;
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    word.store(tid as u64, Ordering::Release);
    // Leaked: the kernel reads both at the thread's exit.
    let node: *mut RobustList = Box::into_raw(Box::new(RobustList {
        next: std::ptr::null(),
    }));
    let head: *mut RobustListHead = Box::into_raw(Box::new(RobustListHead {
        list: RobustList { next: node },
        futex_offset: (word.as_ptr() as libc::c_long).wrapping_sub(node as libc::c_long),
        list_op_pending: std::ptr::null(),
    }));
    // SAFETY: `node` and `head` are fresh, leaked allocations only this thread knows;
    // closing the circular list (node → head) is a plain store into `node`.
    unsafe { (*node).next = std::ptr::addr_of!((*head).list) };
    // SAFETY: the head and node are leaked (valid for the process's life) and laid out as
    // the kernel's structs; the length is the head's size, as set_robust_list requires.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_set_robust_list,
            head.cast_const(),
            std::mem::size_of::<RobustListHead>(),
        )
    };
    if rc != 0 {
        return Err(format!(
            "set_robust_list: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaked_page() -> &'static SharedMemory {
        Box::leak(Box::new(SharedMemory::create(c"life-test", PAGE).unwrap()))
    }

    #[test]
    fn this_process_reads_alive() {
        assert!(alive(process_page().unwrap()));
    }

    #[test]
    fn the_kernel_marks_the_word_when_its_thread_exits() {
        let page = leaked_page();
        let registered = std::thread::spawn(move || {
            register_current_thread(page).unwrap();
            alive(page)
        });
        // join waits for the kernel to clear the thread's id, which it does after walking
        // the thread's robust list.
        assert!(registered.join().unwrap(), "alive while its thread runs");
        assert!(!alive(page), "the exited thread's word still reads alive");
        let word = page.atomic_u64(WORD).unwrap().load(Ordering::Acquire);
        assert_eq!(word & 0xffff_ffff, FUTEX_OWNER_DIED);
    }

    #[test]
    fn a_zero_word_is_not_alive() {
        assert!(!alive(leaked_page()));
    }
}
