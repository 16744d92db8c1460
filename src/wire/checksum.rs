//! The Internet checksum (RFC 1071), in one place: full sums over byte slices, folding, the
//! IPv4 pseudo-header, partial checksums for `CHECKSUM_PARTIAL` / `NEEDS_CSUM`, and the
//! incremental updates of RFC 1624 that NAT and the TTL decrement use.
//!
//! Two representations meet here:
//!
//! * **Accumulators** (`u64`) of a full sum: data is read in *native* byte order, 8 bytes at a
//!   time. The ones-complement sum commutes with a byte swap, so summing native words and
//!   storing the folded result with `to_ne_bytes` ([`finish`], [`finish_l4`]) gives the same
//!   bytes as the big-endian computation, without swapping every word.
//! * **Field values** (`u16`/`u32` as read big-endian from a header) for incremental updates:
//!   [`update`], [`update_partial`], [`diff32`], [`Delta`].
//!
//! The pseudo-header is a value ([`PseudoHeader`]) so that IPv6's (RFC 8200 8.1: 16-byte
//! addresses, a 32-bit upper-layer length) is one more variant, summed by the same code.

use crate::narrow::{len16, low16};

/// Bytes summed before the accumulator is reduced (a multiple of 8, small enough that the inner
/// `u64` sum cannot overflow).
const SUM_BLOCK: usize = 1 << 16;

/// Adds `data` (starting at an even offset of the checksummed region) to a ones-complement
/// accumulator, native byte order. The result is below 2^34 when `acc` is.
#[inline]
pub(crate) fn sum(acc: u64, data: &[u8]) -> u64 {
    let mut acc = acc;
    for block in data.chunks(SUM_BLOCK) {
        // Each step adds at most 2^33, 8192 steps: below 2^46.
        let mut s: u64 = 0;
        let mut words = block.chunks_exact(8);
        for w in &mut words {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            let v = u64::from_ne_bytes(b);
            s += (v & 0xffff_ffff) + (v >> 32);
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            // Zero-padded in place: an odd last byte is the high byte of its (big-endian)
            // word, exactly as the checksum definition requires.
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            let v = u64::from_ne_bytes(b);
            s += (v & 0xffff_ffff) + (v >> 32);
        }
        acc += s;
        acc = (acc & 0xffff_ffff) + (acc >> 32);
    }
    acc
}

/// Sums a 20-byte header (an IPv4 header without options) with five 32-bit loads.
#[inline(always)]
pub(crate) fn sum20(h: &[u8; 20]) -> u64 {
    let w = |i: usize| u64::from(u32::from_ne_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]));
    w(0) + w(4) + w(8) + w(12) + w(16)
}

/// Adds a 16-bit value given as a number (network order on the wire) to an accumulator.
#[inline]
pub(crate) fn add_be16(acc: u64, v: u16) -> u64 {
    acc + u64::from(u16::from_ne_bytes(v.to_be_bytes()))
}

/// Folds an accumulator to 16 bits with end-around carry (native order). Branch-free: the
/// 32-bit halves first (below 2^33), then three 16-bit rounds always reach 16 bits.
#[inline]
pub(crate) fn fold(acc: u64) -> u16 {
    let s = (acc & 0xffff_ffff) + (acc >> 32);
    let s = (s & 0xffff) + (s >> 16);
    let s = (s & 0xffff) + (s >> 16);
    let s = (s & 0xffff) + (s >> 16);
    low16(s)
}

/// True when a region whose sum is `acc` (its checksum field included) verifies: the folded
/// sum is all ones. The test is the same in either byte order.
#[inline]
pub(crate) fn verifies(acc: u64) -> bool {
    // `acc` comes from `sum`, so it is below 2^35: three 16-bit rounds are exact.
    let s = (acc & 0xffff) + (acc >> 16);
    let s = (s & 0xffff) + (s >> 16);
    let s = (s & 0xffff) + (s >> 16);
    s == 0xffff
}

/// The checksum field bytes for a region whose sum (checksum field zero) is `acc`.
#[inline]
pub(crate) fn finish(acc: u64) -> [u8; 2] {
    (!fold(acc)).to_ne_bytes()
}

/// As [`finish`], for a TCP/UDP checksum: 0 is sent as 0xffff (the kernel's `CSUM_MANGLED_0`;
/// a zero UDP checksum means "none", and for TCP the two are the same value).
#[inline]
pub(crate) fn finish_l4(acc: u64) -> [u8; 2] {
    let c = !fold(acc);
    if c == 0 {
        [0xff, 0xff]
    } else {
        c.to_ne_bytes()
    }
}

/// The Internet checksum of `data` as the big-endian value to store.
#[inline]
pub(crate) fn checksum(data: &[u8]) -> u16 {
    u16::from_be_bytes(finish(sum(0, data)))
}

/// The pseudo-header an upper-layer checksum covers, per address family; TCP and UDP
/// checksums take either, and the summing code is shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PseudoHeader {
    /// IPv4 (RFC 793 / 768): source, destination, zero, protocol, upper-layer length.
    Ipv4 {
        /// Source address.
        src: [u8; 4],
        /// Destination address.
        dst: [u8; 4],
        /// IP protocol number.
        proto: u8,
        /// Length of the upper-layer header and payload.
        len: u16,
    },
    /// IPv6 (RFC 8200 8.1): source, destination, upper-layer length (32 bits), zero, next
    /// header. Used by TSO6 segmentation; the IPv6 view will build it too.
    Ipv6 {
        /// Source address.
        src: [u8; 16],
        /// Destination address.
        dst: [u8; 16],
        /// Upper-layer protocol.
        next_header: u8,
        /// Length of the upper-layer header and payload.
        len: u32,
    },
}

impl PseudoHeader {
    /// The IPv4 pseudo-header of a `proto` segment of `len` bytes from `src` to `dst`.
    #[inline]
    pub(crate) fn ipv4(
        src: std::net::Ipv4Addr,
        dst: std::net::Ipv4Addr,
        proto: u8,
        len: usize,
    ) -> Self {
        PseudoHeader::Ipv4 {
            src: src.octets(),
            dst: dst.octets(),
            proto,
            len: len16(len),
        }
    }

    /// Whether `segment` (its checksum field included) verifies under this pseudo-header.
    #[inline]
    pub(crate) fn verifies(&self, segment: &[u8]) -> bool {
        verifies(sum(self.sum(), segment))
    }

    /// The pseudo-header's contribution to a sum.
    #[inline]
    pub(crate) fn sum(&self) -> u64 {
        match *self {
            PseudoHeader::Ipv4 {
                src,
                dst,
                proto,
                len,
            } => {
                let addrs = u64::from(u32::from_ne_bytes(src)) + u64::from(u32::from_ne_bytes(dst));
                add_be16(add_be16(addrs, u16::from(proto)), len)
            }
            PseudoHeader::Ipv6 {
                src,
                dst,
                next_header,
                len,
            } => {
                let addrs = sum(sum(0, &src), &dst);
                let len = add_be16(
                    add_be16(addrs, low16(u64::from(len >> 16))),
                    low16(u64::from(len)),
                );
                add_be16(len, u16::from(next_header))
            }
        }
    }

    /// The *partial* checksum a sender leaves in the L4 checksum field under
    /// `CHECKSUM_PARTIAL` (virtio `NEEDS_CSUM`): the folded, uncomplemented pseudo-header sum;
    /// the device adds the L4 bytes and complements. VXLAN encapsulation leaves the outer
    /// UDP checksum this way.
    #[inline]
    pub(crate) fn partial(&self) -> [u8; 2] {
        fold(self.sum()).to_ne_bytes()
    }
}

// ---------------------------------------------------------------------------------------------
// Incremental updates (RFC 1624), on field values as numbers.
// ---------------------------------------------------------------------------------------------

/// Folds a sum of 16-bit words to 16 bits; 0 stays 0 ("no change"), any nonzero sum gives
/// 1..=0xffff. Two rounds suffice for a sum below 2^32 - 2^16.
#[inline(always)]
pub(crate) fn fold32(mut s: u32) -> u16 {
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    low16(u64::from(s))
}

/// The sum of `~old + new` over the two 16-bit halves of a 32-bit field that differ
/// (branch-free: every half is summed, then 0xffff taken back for each unchanged half, which
/// contributed exactly that). Below 2^18.
#[inline(always)]
pub(crate) fn diff32(old: u32, new: u32) -> u32 {
    let x = !old;
    let d = old ^ new;
    let same = u32::from(d >> 16 == 0) + u32::from(d & 0xffff == 0);
    (x >> 16) + (x & 0xffff) + (new >> 16) + (new & 0xffff) - 0xffff * same
}

/// A complete checksum `hc` after a change whose prefolded sum of `~old + new` is `d`:
/// `~(~hc + d)` (RFC 1624 eqn. 3); `hc` itself when `d` is 0.
#[inline(always)]
pub(crate) fn update(hc: u16, d: u16) -> u16 {
    if d == 0 {
        hc
    } else {
        !fold32(u32::from(!hc) + u32::from(d))
    }
}

/// A partial (uncomplemented pseudo-header) sum after the prefolded change `d`, as Linux's
/// `inet_proto_csum_replace4` under `CHECKSUM_PARTIAL`.
#[inline(always)]
pub(crate) fn update_partial(sum: u16, d: u16) -> u16 {
    if d == 0 {
        sum
    } else {
        fold32(u32::from(sum) + u32::from(d))
    }
}

/// Ones-complement addition of two 16-bit values (end-around carry).
#[inline(always)]
pub(crate) fn add16(a: u16, b: u16) -> u16 {
    let c = u32::from(a) + u32::from(b);
    low16(u64::from((c & 0xffff) + (c >> 16)))
}

/// The sum of `~old + new` over the changed 16-bit words of a region (RFC 1624 eqn. 3), built
/// field by field. Unchanged words add nothing, so an empty delta leaves a checksum
/// bit-for-bit alone.
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct Delta(u64);

impl Delta {
    /// Records a 16-bit field change.
    #[inline]
    pub(crate) fn word(&mut self, old: u16, new: u16) {
        if old != new {
            self.0 += u64::from(!old) + u64::from(new);
        }
    }
    /// Records a 32-bit field change (an IPv4 address).
    #[inline]
    pub(crate) fn word32(&mut self, old: u32, new: u32) {
        self.word((old >> 16) as u16, (new >> 16) as u16);
        self.word(low16(u64::from(old)), low16(u64::from(new)));
    }
    /// Adds another region's changes.
    #[inline]
    pub(crate) fn add(&mut self, other: Delta) {
        self.0 += other.0;
    }
    /// A complete checksum after the change: `~(~hc + delta)`.
    #[inline]
    pub(crate) fn apply_full(self, hc: u16) -> u16 {
        if self.0 == 0 {
            hc
        } else {
            !fold(u64::from(!hc) + self.0)
        }
    }
    /// A partial (uncomplemented pseudo-header) sum after the change.
    #[inline]
    pub(crate) fn apply_partial(self, sum: u16) -> u16 {
        if self.0 == 0 {
            sum
        } else {
            fold(u64::from(sum) + self.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Reference: plain big-endian words, folded at every step.
    fn ref_sum(data: &[u8]) -> u32 {
        let mut s: u32 = 0;
        for c in data.chunks(2) {
            s += u32::from(c[0]) << 8 | u32::from(*c.get(1).unwrap_or(&0));
            s = (s & 0xffff) + (s >> 16);
        }
        s
    }

    #[test]
    fn rfc1071_example() {
        // RFC 1071 section 3: the sum of 00 01 f2 03 f4 f5 f6 f7 is ddf2.
        let d = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(u16::from_be_bytes(fold(sum(0, &d)).to_ne_bytes()), 0xddf2);
        assert_eq!(checksum(&d), !0xddf2);
    }

    #[test]
    fn pseudo_header_matches_the_bytes() {
        let ph = PseudoHeader::Ipv4 {
            src: [10, 0, 0, 1],
            dst: [192, 168, 1, 2],
            proto: 6,
            len: 40,
        };
        let bytes = [10, 0, 0, 1, 192, 168, 1, 2, 0, 6, 0, 40];
        assert_eq!(fold(ph.sum()), fold(sum(0, &bytes)));
        assert_eq!(
            u16::from_be_bytes(ph.partial()),
            u16::try_from(ref_sum(&bytes)).unwrap()
        );
    }

    proptest! {
        #[test]
        fn fast_sum_is_the_reference(
            data in prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..300),
                proptest::collection::vec(any::<u8>(), 0..150_000),
            ],
            split in any::<proptest::sample::Index>(),
        ) {
            let got = fold(sum(0, &data));
            prop_assert_eq!(u16::from_be_bytes(got.to_ne_bytes()), u16::try_from(ref_sum(&data)).unwrap());
            // Summing in two even-aligned parts gives the same result.
            let at = split.index(data.len() + 1) & !1;
            prop_assert_eq!(fold(sum(sum(0, &data[..at]), &data[at..])), got);
        }

        #[test]
        fn incremental_equals_recompute(
            mut data in proptest::collection::vec(any::<u8>(), 4..64),
            at in 0usize..30,
            new in any::<u32>(),
        ) {
            let at = (at % (data.len() / 2 - 1)) * 2;
            if data.len() % 2 == 1 { data.pop(); }
            let c0 = checksum(&data);
            let old = u32::from_be_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]);
            data[at..at + 4].copy_from_slice(&new.to_be_bytes());
            let full = checksum(&data);
            let inc = update(c0, fold32(diff32(old, new)));
            let mut d = Delta::default();
            d.word32(old, new);
            let inc2 = d.apply_full(c0);
            for c in [inc, inc2] {
                prop_assert!(c == full || (c ^ full) == 0xffff && (c == 0 || full == 0));
            }
        }
    }
}
