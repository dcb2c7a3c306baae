//! Passing descriptors between processes over a unix stream socket (SCM_RIGHTS).
//!
//! [`send_with_fd`] writes a small message with at most one descriptor attached;
//! [`recv_with_fd`] reads one, taking ownership of every descriptor the message carried
//! (a sender may attach more than asked: the extra ones are closed, never leaked) and
//! marking them close-on-exec.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// Most descriptors one received message may carry before the kernel truncates (and
/// closes) the rest: room for a sender that attaches more than the protocol asks.
const MAX_RECEIVED_FDS: usize = 8;
/// Bytes of control buffer (`u64`s, so that it is aligned for `cmsghdr`).
const CONTROL_WORDS: usize = 16;

/// Sends `data` on `socket` in one sendmsg, with `fd` attached if given. Never raises
/// SIGPIPE; a short send is an error (messages are tiny, the socket buffer is empty).
pub(crate) fn send_with_fd(
    socket: &UnixStream,
    data: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let mut control = [0u64; CONTROL_WORDS];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr().cast_mut().cast(),
        iov_len: data.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        let raw: RawFd = fd.as_raw_fd();
        // SAFETY: CMSG_SPACE is a pure size computation.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
        debug_assert!(space <= std::mem::size_of_val(&control));
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: `msg` points at `control`, which is aligned (u64) and at least `space`
        // bytes long, so the first header exists and its data has room for one RawFd; the
        // writes stay inside `control`.
        unsafe {
            let header = libc::CMSG_FIRSTHDR(&msg);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<RawFd>(), raw);
        }
    }
    loop {
        // SAFETY: `msg` and everything it points to (`iov`, `data`, `control`) are live for
        // the call; the kernel only reads them.
        let sent = unsafe {
            libc::sendmsg(
                socket.as_raw_fd(),
                &msg,
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
        if sent < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if sent as usize != data.len() {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "short sendmsg"));
        }
        return Ok(());
    }
}

/// Receives up to `buf.len()` bytes from `socket` (one recvmsg, honouring the socket's
/// read timeout) and the first descriptor attached to them, if any. Returns the byte
/// count (0 at end of stream). Every other descriptor that came along is closed.
pub(crate) fn recv_with_fd(
    socket: &UnixStream,
    buf: &mut [u8],
) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut control = [0u64; CONTROL_WORDS];
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space =
        unsafe { libc::CMSG_SPACE((MAX_RECEIVED_FDS * std::mem::size_of::<RawFd>()) as u32) }
            as usize;
    debug_assert!(space <= std::mem::size_of_val(&control));
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    let got = loop {
        // SAFETY: `msg` points at live buffers (`buf` through `iov`, `control`) of the
        // lengths it states; the kernel writes at most that much into them.
        let got = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if got >= 0 {
            break got as usize;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    };
    let mut received = Vec::new();
    // SAFETY: the kernel filled `control` up to `msg.msg_controllen` with well-formed
    // headers; CMSG_FIRSTHDR / CMSG_NXTHDR stay inside that length and return null at its
    // end. Each SCM_RIGHTS payload is an array of descriptors the kernel just installed in
    // this process for us alone, read unaligned, and owned exactly once here.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&msg);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(header);
                let payload = (*header).cmsg_len as usize - (data as usize - header as usize);
                let count = payload / std::mem::size_of::<RawFd>();
                for index in 0..count {
                    let raw = std::ptr::read_unaligned(data.cast::<RawFd>().add(index));
                    received.push(OwnedFd::from_raw_fd(raw));
                }
            }
            header = libc::CMSG_NXTHDR(&msg, header);
        }
    }
    // The rest of `received` is dropped: closed.
    let first = (!received.is_empty()).then(|| received.swap_remove(0));
    Ok((got, first))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn a_descriptor_crosses_with_its_bytes() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut left, right) = UnixStream::pair().unwrap();
        send_with_fd(&a, b"hello", Some(std::os::fd::AsFd::as_fd(&right))).unwrap();
        let mut buf = [0u8; 16];
        let (got, fd) = recv_with_fd(&b, &mut buf).unwrap();
        assert_eq!(&buf[..got], b"hello");
        let mut passed = UnixStream::from(fd.expect("a descriptor came along"));
        left.write_all(b"through").unwrap();
        let mut out = [0u8; 7];
        passed.read_exact(&mut out).unwrap();
        assert_eq!(&out, b"through");
        // SAFETY: fcntl on a descriptor we own only reads its flags.
        let flags = unsafe { libc::fcntl(passed.as_raw_fd(), libc::F_GETFD) };
        assert!(flags & libc::FD_CLOEXEC != 0, "received close-on-exec");
    }

    #[test]
    fn bytes_without_a_descriptor_and_end_of_stream() {
        let (a, b) = UnixStream::pair().unwrap();
        send_with_fd(&a, b"bare", None).unwrap();
        drop(a);
        let mut buf = [0u8; 16];
        let (got, fd) = recv_with_fd(&b, &mut buf).unwrap();
        assert_eq!((&buf[..got], fd.is_none()), (&b"bare"[..], true));
        assert_eq!(recv_with_fd(&b, &mut buf).unwrap().0, 0);
    }
}
