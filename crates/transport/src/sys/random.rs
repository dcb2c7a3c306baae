//! Random numbers from the kernel (getrandom(2)), for secrets such as hello tokens.

use crate::{Result, TransportError};

/// A random 64-bit value from the kernel's pool.
pub(crate) fn random_u64() -> Result<u64> {
    let mut bytes = [0u8; 8];
    // SAFETY: the kernel writes at most `bytes.len()` bytes into the live local array.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if got != bytes.len() as isize {
        return Err(TransportError::last_os("getrandom"));
    }
    Ok(u64::from_le_bytes(bytes))
}

#[cfg(test)]
mod tests {
    #[test]
    fn values_differ() {
        assert_ne!(super::random_u64().unwrap(), super::random_u64().unwrap());
    }
}
