//! Owner values: what a backend writes into a lock key or node name so that its own acquire can
//! tell its key from anyone else's.

/// 128 random bits as 32 lowercase hex digits: unique among the owners of a name for as long as
/// any of them can matter. Written digit by digit rather than through `format!`, which cost
/// several times as much on the path of every acquire.
pub fn random_owner() -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut bits = rand::random::<u128>();
    let mut digits = [0u8; 32];
    for digit in digits.iter_mut().rev() {
        *digit = HEX[(bits & 0xf) as usize];
        bits >>= 4;
    }
    // Hex digits are ASCII, so this never falls back.
    std::str::from_utf8(&digits).unwrap_or_default().to_owned()
}

/// A random number in `0..n` (0 when `n` is 0): where a semaphore's attempt starts among its
/// slots, so that attempts spread over them rather than all trying slot 0 first.
pub fn random_below(n: u32) -> u32 {
    if n == 0 {
        return 0;
    }
    rand::random_range(0..n)
}

#[cfg(test)]
mod tests {
    use super::random_owner;

    #[test]
    fn owners_are_32_hex_digits_and_differ() {
        let (a, b) = (random_owner(), random_owner());
        assert_eq!(a.len(), 32);
        assert!(
            a.bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_ne!(a, b);
    }
}
