//! Token ids → block keys (wire fact sheet §9): one running 64-bit state absorbs every token;
//! after each full block the state is that block's key, so key i depends on blocks 0..=i.
//! A trailing partial block is dropped. Instance, model and spec names are not hashed.

use kvcm_index::BlockKey;

/// Golden-ratio increment of the absorb step (boost-style hash_combine).
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// Mixes one token into the running state (all arithmetic mod 2^64; `>>` sign-extends).
pub fn absorb(state: i64, token: i64) -> i64 {
    let mixed = (token as u64)
        .wrapping_add(GOLDEN)
        .wrapping_add(state.wrapping_shl(12) as u64)
        .wrapping_add((state >> 32) as u64);
    ((state as u64) ^ mixed) as i64
}

/// The prefix-chained keys of `tokens` cut into blocks of `block_size` tokens.
/// `block_size` must be positive (the caller validates it).
pub fn block_keys_from_tokens(tokens: &[i64], block_size: usize) -> Vec<BlockKey> {
    let block_count = tokens.len() / block_size;
    let mut keys = Vec::with_capacity(block_count);
    let mut state = 0i64;
    for block in tokens.chunks_exact(block_size) {
        state = block.iter().fold(state, |acc, &token| absorb(acc, token));
        keys.push(state);
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(tokens: &[i64], block_size: usize) -> Vec<BlockKey> {
        block_keys_from_tokens(tokens, block_size)
    }

    #[test]
    fn fact_sheet_vectors() {
        let pair = vec![-8366447769517741626, 455111481605203084];
        assert_eq!(keys(&[1, 2, 3, 4], 2), pair);
        assert_eq!(keys(&[1, 2, 3, 4, 5], 2), pair);
        assert_eq!(keys(&[456], 1), vec![-7046029254386352675]);
        assert_eq!(
            keys(&[100, 101, 102], 1),
            vec![
                -7046029254386353031,
                -8366447769518081462,
                8024479186331664069
            ]
        );
        let sixteen: Vec<i64> = (0..16).collect();
        assert_eq!(
            keys(&sixteen, 4),
            vec![
                455111276453135508,
                6713779586671547074,
                -1712794477054135035,
                6556265598806870907
            ]
        );
        assert_eq!(
            keys(&[-5, 7, 1 << 62, i64::MIN], 2),
            vec![-8366447769517782587, 5066797075115955342]
        );
    }

    #[test]
    fn fewer_tokens_than_a_block_give_no_key() {
        assert!(keys(&[1, 2, 3], 4).is_empty());
        assert!(keys(&[], 1).is_empty());
    }
}
