//! A reader of DER elements (tag, definite length, contents) for the few X.509 structures
//! the server reads itself: the identity of a client certificate (`super::client_cert`) and
//! the signature of a revocation list (`super::crl_signature`).
//!
//! Invariant: it never panics on any bytes; a truncated element, an indefinite or over-long
//! length (more than 4 length bytes) reads as `None`.

/// Tag of a SEQUENCE.
pub(super) const SEQUENCE: u8 = 0x30;

/// A run of DER bytes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Der<'a>(pub(super) &'a [u8]);

impl<'a> Der<'a> {
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The tag of the next element.
    pub(super) fn peek(&self) -> Option<u8> {
        self.0.first().copied()
    }

    /// The next element's contents, if its tag is `tag`, and what follows it.
    pub(super) fn element(self, tag: u8) -> Option<(Der<'a>, Der<'a>)> {
        let (&found, rest) = self.0.split_first()?;
        if found != tag {
            return None;
        }
        let (&first, rest) = rest.split_first()?;
        let (length, rest) = match first {
            0..=0x7f => (usize::from(first), rest),
            // Long form: 1 to 4 length bytes (a certificate or a list is far smaller than
            // 4 GiB).
            0x81..=0x84 => {
                let count = usize::from(first & 0x7f);
                let (bytes, rest) = rest.split_at_checked(count)?;
                let length = bytes.iter().fold(0usize, |n, &b| (n << 8) | usize::from(b));
                (length, rest)
            }
            _ => return None,
        };
        let (contents, rest) = rest.split_at_checked(length)?;
        Some((Der(contents), Der(rest)))
    }

    /// What follows the next element, whatever its tag.
    pub(super) fn skip(self) -> Option<Der<'a>> {
        let tag = self.peek()?;
        self.element(tag).map(|(_, rest)| rest)
    }

    /// The next element whole (tag, length and contents), and what follows it.
    pub(super) fn whole(self) -> Option<(&'a [u8], Der<'a>)> {
        let rest = self.skip()?;
        Some((&self.0[..self.0.len() - rest.0.len()], rest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_read_in_order_and_bad_lengths_read_as_none() {
        // SEQUENCE { INTEGER 5, OCTET STRING (long form, 2 bytes) } then a trailing NULL.
        let bytes = [
            0x30, 0x08, 0x02, 0x01, 0x05, 0x04, 0x81, 0x02, 0xaa, 0xbb, 0x05, 0x00,
        ];
        let (sequence, rest) = Der(&bytes).element(SEQUENCE).expect("sequence");
        assert_eq!(rest.0, &[0x05, 0x00]);
        let (whole, after) = sequence.whole().expect("integer");
        assert_eq!(whole, &[0x02, 0x01, 0x05]);
        let (octets, end) = after.element(0x04).expect("octets");
        assert_eq!((octets.0, end.is_empty()), (&[0xaa, 0xbb][..], true));
        assert!(Der(&bytes).element(0x04).is_none(), "another tag");
        for bad in [
            &[0x30][..],
            &[0x30, 0x80],
            &[0x30, 0x85, 0, 0, 0, 0, 1],
            &[0x30, 0x02, 0],
        ] {
            assert!(Der(bad).element(SEQUENCE).is_none(), "{bad:?}");
            assert!(Der(bad).whole().is_none(), "{bad:?}");
        }
    }
}
