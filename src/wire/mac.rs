//! Ethernet MAC addresses.

use std::fmt;
use std::str::FromStr;

/// A 48-bit Ethernet MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MacAddr(pub [u8; 6]);

/// Serialized as its text, `aa:bb:cc:dd:ee:ff`.
#[cfg(feature = "serde")]
impl serde::Serialize for MacAddr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl MacAddr {
    /// The broadcast address `ff:ff:ff:ff:ff:ff`.
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);
    /// The all-zero address, never a valid station.
    pub const ZERO: MacAddr = MacAddr([0; 6]);

    /// Reads a MAC address from the first six bytes of `b`.
    ///
    /// # Panics
    /// If `b` is shorter than six bytes; callers on the fast path check lengths first.
    #[inline]
    pub fn from_slice(b: &[u8]) -> MacAddr {
        let mut m = [0u8; 6];
        m.copy_from_slice(&b[..6]);
        MacAddr(m)
    }

    /// True for group (multicast and broadcast) addresses: the I/G bit is set.
    #[inline]
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 == 1
    }

    /// True for `ff:ff:ff:ff:ff:ff`.
    #[inline]
    pub fn is_broadcast(&self) -> bool {
        self.0 == [0xff; 6]
    }

    /// True for `00:00:00:00:00:00`.
    #[inline]
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 6]
    }

    /// True for the IEEE 802.1D reserved group `01:80:c2:00:00:0X`, which bridges do not forward
    /// (STP, pause frames, LACP, 802.1X, LLDP).
    #[inline]
    pub fn is_link_local(&self) -> bool {
        self.0[..5] == [0x01, 0x80, 0xc2, 0x00, 0x00] && self.0[5] & 0xf0 == 0
    }

    /// True for a unicast address that is usable as a station address (neither group nor zero).
    #[inline]
    pub fn is_station(&self) -> bool {
        !self.is_multicast() && !self.is_zero()
    }

    /// The address as the low 48 bits of a `u64` (big-endian byte order).
    #[inline]
    pub fn to_u64(&self) -> u64 {
        let b = self.0;
        (u64::from(b[0]) << 40)
            | (u64::from(b[1]) << 32)
            | (u64::from(b[2]) << 24)
            | (u64::from(b[3]) << 16)
            | (u64::from(b[4]) << 8)
            | u64::from(b[5])
    }

    /// The inverse of [`MacAddr::to_u64`]; bits above 48 are ignored.
    #[inline]
    pub fn from_u64(v: u64) -> MacAddr {
        let b = v.to_be_bytes();
        MacAddr([b[2], b[3], b[4], b[5], b[6], b[7]])
    }

    /// A locally administered unicast address derived from `seed` (for hosts made in tests and demos).
    pub fn local(seed: u32) -> MacAddr {
        let s = seed.to_be_bytes();
        MacAddr([0x02, 0x00, s[0], s[1], s[2], s[3]])
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The error for a string that is not `xx:xx:xx:xx:xx:xx`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseMacError(pub String);

impl fmt::Display for ParseMacError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid MAC address {:?}: expected six hex bytes like 02:00:00:00:00:01",
            self.0
        )
    }
}

impl std::error::Error for ParseMacError {}

impl FromStr for MacAddr {
    type Err = ParseMacError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseMacError(s.to_string());
        let mut out = [0u8; 6];
        let mut parts = s.split([':', '-']);
        for b in out.iter_mut() {
            let p = parts.next().ok_or_else(err)?;
            if p.is_empty() || p.len() > 2 {
                return Err(err());
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| err())?;
        }
        if parts.next().is_some() {
            return Err(err());
        }
        Ok(MacAddr(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_print_round_trip() {
        let m: MacAddr = "02:0a:ff:00:10:9c".parse().unwrap();
        assert_eq!(m.0, [0x02, 0x0a, 0xff, 0x00, 0x10, 0x9c]);
        assert_eq!(m.to_string(), "02:0a:ff:00:10:9c");
        assert_eq!(MacAddr::from_u64(m.to_u64()), m);
        assert!("02:0a:ff:00:10".parse::<MacAddr>().is_err());
        assert!("02:0a:ff:00:10:9c:00".parse::<MacAddr>().is_err());
        assert!("zz:0a:ff:00:10:9c".parse::<MacAddr>().is_err());
    }

    #[test]
    fn classes() {
        assert!(MacAddr::BROADCAST.is_multicast());
        assert!(!MacAddr::ZERO.is_station());
        assert!(MacAddr([0x01, 0x80, 0xc2, 0, 0, 0x0e]).is_link_local());
        assert!(!MacAddr([0x01, 0x80, 0xc2, 0, 0, 0x10]).is_link_local());
        assert!(MacAddr::local(7).is_station());
    }
}
