//! Lower-case hex text of secrets and digests (API key ids and secrets; the server's
//! queue-pair tokens, pool keys and tickets).

/// `bytes` as lower-case hex.
pub fn encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The `N` bytes that `text` spells in hex; `None` for anything else.
pub fn decode<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N || !text.is_ascii() {
        return None;
    }
    let mut bytes = [0u8; N];
    for (at, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * at..2 * at + 2], 16).ok()?;
    }
    Some(bytes)
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trips_and_refuses_other_text() {
        let bytes = [0u8, 1, 0xab, 0xff];
        assert_eq!(super::encode(&bytes), "0001abff");
        assert_eq!(super::decode::<4>("0001abff"), Some(bytes));
        assert_eq!(super::decode::<4>("0001ABFF"), Some(bytes));
        for bad in ["", "0001ab", "0001abff00", "0001abzz", "éé0001ab"] {
            assert_eq!(super::decode::<4>(bad), None, "{bad:?}");
        }
    }
}
