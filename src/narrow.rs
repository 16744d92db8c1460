//! Narrowing integer conversions whose truncation is the intent, each named for why.
//!
//! The crate warns on `clippy::cast_possible_truncation` (see `Cargo.toml`): a lossy `as`
//! cast is either avoided (the value has the right type from the start, or is converted with
//! `try_from` where it is checked) or goes through one of these helpers, which say why no
//! information that matters is lost. They compile to the bare `as` cast.

/// The low 8 bits of `x`: a field of a packed word, shifted down by the caller.
#[inline(always)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "taking the low bits is the point: the caller shifted the field to the bottom"
)]
pub(crate) const fn low8(x: u64) -> u8 {
    x as u8
}

/// The low 16 bits of `x`: a field of a packed word (shifted down by the caller), a folded
/// checksum, or a value defined modulo 2^16 (an IP identification, a port offset).
#[inline(always)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "taking the low bits is the point: a packed field, a folded sum or a mod-2^16 value"
)]
pub(crate) const fn low16(x: u64) -> u16 {
    x as u16
}

/// The low 32 bits of `x`: a field of a packed word (shifted down by the caller), part of a
/// hash, or a value defined modulo 2^32 (a TCP sequence-number offset).
#[inline(always)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "taking the low bits is the point: a packed field, hash bits or a mod-2^32 value"
)]
pub(crate) const fn low32(x: u64) -> u32 {
    x as u32
}

/// The low 64 bits of `x` (a 128-bit product's low half; its high half is `x >> 64`).
#[inline(always)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "the low half of a 128-bit product; callers take the high half separately"
)]
pub(crate) const fn low64(x: u128) -> u64 {
    x as u64
}

/// The low bits of `x` as an index: a hash about to be masked down to a table's size (a
/// `usize`), so only bits below the mask matter.
#[inline(always)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "the result is masked to a table size, which is a usize: the lost high bits are unused"
)]
pub(crate) const fn low_usize(x: u64) -> usize {
    x as usize
}

/// `x mod len`, as an index into a slice of `len` elements (`len > 0`).
#[inline(always)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "the remainder is below len, which is a usize"
)]
pub(crate) const fn reduce(x: u64, len: usize) -> usize {
    (x % len as u64) as usize
}

/// `x` scaled from `0..2^64` to `0..len` by a multiply (Lemire's reduction): an index into a
/// slice of `len` elements.
#[inline(always)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "(x * len) >> 64 is below len, which is a usize"
)]
pub(crate) const fn scale(x: u64, len: usize) -> usize {
    ((x as u128 * len as u128) >> 64) as usize
}

/// A length or offset inside one IPv4 packet (or one TCP segment of a super-frame), as the
/// 16-bit field that carries it. Callers only pass values bounded by a 16-bit total length
/// (a parsed header's or a checked MTU's), so the value fits.
#[inline(always)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "callers pass lengths within one IPv4 packet, whose total length is itself a u16"
)]
pub(crate) const fn len16(x: usize) -> u16 {
    debug_assert!(x <= u16::MAX as usize);
    x as u16
}

/// A length inside one packet or super-frame, as a 32-bit field (a length counter, a TCP
/// segment length in a pseudo-header). Packets are far below 4 GiB.
#[inline(always)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "a packet's length (at most 64 KiB, or a 64 KiB super-frame) fits 32 bits"
)]
pub(crate) const fn len32(x: usize) -> u32 {
    debug_assert!(x <= u32::MAX as usize);
    x as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_truncate_as_the_casts_did() {
        assert_eq!(low8(0x1234), 0x34);
        assert_eq!(low16(0x1_2345_6789), 0x6789);
        assert_eq!(low32(0x1234_5678_9abc_def0), 0x9abc_def0);
        assert_eq!(low64((7u128 << 64) | 9), 9);
        assert_eq!(low_usize(0xff) & 0xf, 0xf);
        assert_eq!(reduce(17, 5), 2);
        assert_eq!(scale(u64::MAX, 10), 9);
        assert_eq!(scale(0, 10), 0);
        assert_eq!(len16(1500), 1500);
        assert_eq!(len32(65536), 65536);
    }
}
