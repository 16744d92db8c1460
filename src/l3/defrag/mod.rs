//! IP reassembly in front of connection tracking, for both families, bounded as Open
//! vSwitch's userspace `ipf` and Linux's `nf_defrag_ipv4`/`nf_defrag_ipv6` are.
//!
//! A fragment is copied in ([`Defrag::push`]): its data into its datagram's buffer at its
//! offset, its headers (link and IP, up to its data) kept beside. When the last hole closes,
//! the first fragment's headers, made whole, are written in front of the payload, so the
//! datagram is one frame where it lies ([`Datagram::frame`]; each byte of data is copied
//! once, and a worker hands that very buffer on as the packet's), on which conntrack and
//! NAT run as on any packet; [`Datagram::fragments`] then cuts the (rewritten) datagram
//! back at the original fragments' boundaries, each under its own headers with the
//! datagram's new addresses, so what leaves has the sizes, DF bits and identification the
//! sender chose (as OVS sends the original fragments after `ipf` and Linux refragments at
//! `frag_max_size`); a fragment the egress MTU cannot carry is handled by the router as
//! any packet (fragmented again over IPv4 without DF, an ICMP error otherwise).
//!
//! Bounds, each refusal counted under its own reason ([`FragDrop`]):
//! - fragments held at once ([`DefragConfig::max_frags`], OVS's default 1000) and bytes of
//!   datagram buffers ([`DefragConfig::max_bytes`], Linux's `ipfrag_high_thresh` 4 MiB): a
//!   fragment beyond either is refused (`frag_table_full`), as Linux does (it evicts
//!   nothing: the oldest lists leave by their timeout);
//! - a datagram's list lives [`DefragConfig::timeout`] from its first fragment (OVS's 15 s);
//!   then it is freed, no ICMP "reassembly time exceeded" (a router's conntrack does not
//!   send one: Linux sends it for local delivery only);
//! - every fragment but the last carries at least [`DefragConfig::min_frag`] bytes of IP
//!   packet (OVS: 1200 for IPv4, 1280 for IPv6, the IPv6 minimum MTU) and a multiple of 8
//!   bytes of data; at most [`MAX_FRAGS_PER_DATAGRAM`] fragments make a datagram; the
//!   datagram fits 65,535 bytes of IP packet;
//! - overlapping fragments discard the whole datagram (RFC 5722, Linux for both families
//!   since 4.19); an exact duplicate is dropped and the list kept, as Linux does.
//!
//! Sans-IO and deterministic: the caller gives the time; nothing here sleeps or reads a
//! clock. Buffers are recycled, so a flood of fragments reaches a steady state of memory.

mod family;
#[cfg(test)]
mod tests;

pub use family::FragFamily;

use std::collections::VecDeque;
use std::time::Duration;

use crate::time::Instant;
use crate::wire::family::{Family, IpProto};

/// At most this many fragments make one datagram (65,535 bytes in fragments of at least
/// 1,200 bytes need 55).
pub const MAX_FRAGS_PER_DATAGRAM: usize = 64;

/// The most bytes of headers (link and IP, up to the fragment's data) kept per fragment:
/// Ethernet with a VLAN tag, and an IPv4 header with options or an IPv6 header with
/// extension headers in front of its fragment header.
pub const MAX_FRAG_HEADERS: usize = 18 + 40 + 128 + 8;

/// The largest IP packet a datagram may reassemble to.
const MAX_DATAGRAM: usize = 65_535;

/// Limits of a reassembly table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DefragConfig {
    /// Fragments held at once, all datagrams together (OVS's `max-frag-list`... default
    /// 1000).
    pub max_frags: usize,
    /// Bytes of datagram buffers held at once (Linux's `ipfrag_high_thresh`, 4 MiB).
    pub max_bytes: usize,
    /// How long a datagram's fragments are kept from its first one (OVS: 15 s).
    pub timeout: Duration,
    /// The smallest IP packet a fragment other than the last may be (bytes, IP header
    /// included): OVS's 1200 for IPv4, 1280 for IPv6.
    pub min_frag: usize,
}

impl DefragConfig {
    /// OVS's defaults for family `A`.
    pub fn default_for<A: Family>() -> DefragConfig {
        DefragConfig {
            max_frags: 1000,
            max_bytes: 4 << 20,
            timeout: Duration::from_secs(15),
            min_frag: if A::VERSION == 4 { 1200 } else { 1280 },
        }
    }
}

/// Why a fragment was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum FragDrop {
    /// Its IP header or fragment header is cut short or inconsistent (lengths that lie).
    Malformed,
    /// A fragment other than the last below the minimum size, or whose data is not a
    /// multiple of 8 bytes.
    TooSmall,
    /// It ends past 65,535 bytes of IP packet, or past the end the last fragment gave.
    Oversize,
    /// It overlaps another fragment of its datagram: the whole datagram was discarded.
    Overlap,
    /// The same offset and length as a fragment already held: dropped, the list kept.
    Duplicate,
    /// Its datagram already has the most fragments allowed: the whole datagram discarded.
    TooManyFragments,
    /// The table holds its most fragments or bytes.
    TableFull,
}

impl FragDrop {
    /// The counter's name, as `show stats` prints it.
    pub fn name(self) -> &'static str {
        match self {
            FragDrop::Malformed => "frag_malformed",
            FragDrop::TooSmall => "frag_too_small",
            FragDrop::Oversize => "frag_oversize",
            FragDrop::Overlap => "frag_overlap",
            FragDrop::Duplicate => "frag_duplicate",
            FragDrop::TooManyFragments => "frag_too_many",
            FragDrop::TableFull => "frag_table_full",
        }
    }
}

/// The facts of one fragment, from [`FragFamily::parse`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fragment<A> {
    /// Which datagram it belongs to.
    pub key: FragKey<A>,
    /// Where its data goes in the datagram's payload (bytes).
    pub offset: usize,
    /// More fragments follow (IPv4's MF, IPv6's M flag).
    pub more: bool,
    /// Bytes of IP header in front of its data: the IPv4 header with options, or the IPv6
    /// header and extension headers up to and including the fragment header.
    pub hdr_len: usize,
    /// Bytes of data it carries.
    pub data_len: usize,
    /// IPv6: where the "next header" byte that names the fragment header sits (from the
    /// start of the IP header); IPv4: 0.
    pub next_at: usize,
}

impl<A> Fragment<A> {
    /// Where its data ends in the datagram's payload.
    pub fn end(&self) -> usize {
        self.offset + self.data_len
    }
}

/// A datagram's identity: addresses, protocol, identification, and the caller's zone (the
/// conntrack zone, so that two zones never mix fragments).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FragKey<A> {
    /// Source address.
    pub src: A,
    /// Destination address.
    pub dst: A,
    /// The upper-layer protocol.
    pub proto: IpProto,
    /// Identification (16 bits over IPv4, 32 over IPv6).
    pub id: u32,
    /// The caller's zone.
    pub zone: u16,
}

/// Counters of a reassembly table (monotonic).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DefragStats {
    /// Fragments received (`ReasmReqds`).
    pub fragments: u64,
    /// Datagrams put together (`ReasmOKs`).
    pub reassembled: u64,
    /// Datagrams freed at their timeout, incomplete (`ReasmTimeout`).
    pub timeouts: u64,
    /// Refused fragments, by reason, in [`FragDrop`]'s order.
    pub drops: [u64; 7],
}

impl DefragStats {
    /// Fragments refused for `r`.
    pub fn drop_count(&self, r: FragDrop) -> u64 {
        self.drops[r as usize]
    }
}

/// One fragment held: where its data sits and its headers.
#[derive(Clone, Copy)]
struct Piece {
    offset: u32,
    end: u32,
    /// Bytes of link header in front of the IP header.
    l3_off: u8,
    /// Bytes of `hdr` used: link header + IP header up to the data.
    hdr_len: u8,
    hdr: [u8; MAX_FRAG_HEADERS],
}

/// Bytes in front of a list's payload in its buffer: a packet buffer's headroom, then room
/// for the whole datagram's link and IP headers, so that the complete datagram is a frame in
/// that buffer where it lies (see [`Frags::take`]).
const FRONT: usize = crate::buf::HEADROOM + MAX_FRAG_HEADERS;

/// A datagram being put together.
struct List<A> {
    key: FragKey<A>,
    first_seen: Instant,
    /// Sorted by offset, no two overlapping.
    pieces: Vec<Piece>,
    /// The buffer the datagram is put together in: [`FRONT`] bytes, then the payload, each
    /// piece's data at its offset. Its length is its room (grown as fragments come, recycled
    /// with its room).
    data: Box<[u8]>,
    /// The payload's extent so far: the end of the furthest piece (what the table's bytes
    /// count).
    extent: usize,
    /// The payload's length, once the last fragment came.
    total: Option<usize>,
    /// The first fragment's `next_at` (IPv6).
    next_at: usize,
}

impl<A> List<A> {
    /// Bytes of data held (no holes counted).
    fn covered(&self) -> usize {
        self.pieces
            .iter()
            .map(|p| (p.end - p.offset) as usize)
            .sum()
    }
}

/// The outcome of [`Defrag::push`] for an accepted fragment.
#[derive(Debug, PartialEq, Eq)]
pub enum Pushed {
    /// Held until its datagram is complete.
    Held,
    /// Its datagram is complete: [`Defrag::datagram`] has it.
    Complete,
}

/// A reassembly table for one family (one per worker, like the per-worker pools: fragments
/// of one datagram must reach one worker, which the receive-side flow hash of IP addresses
/// gives).
pub struct Defrag<A: FragFamily> {
    cfg: DefragConfig,
    lists: hashbrown::HashMap<FragKey<A>, List<A>>,
    /// Keys in the order of their first fragment (the order they time out in); a key whose
    /// list is gone (or was made anew) is skipped when it comes up.
    order: VecDeque<(Instant, FragKey<A>)>,
    /// Pieces held in all lists.
    frags: usize,
    /// Bytes of list buffers in use (their lengths: the few spare buffers kept for reuse
    /// are not counted).
    bytes: usize,
    /// Recycled buffers (at most a few kept).
    spare: Vec<(Vec<Piece>, Box<[u8]>)>,
    /// Where the last datagram put together lies in its list's buffer, as one frame (start,
    /// length).
    whole: (usize, usize),
    /// Its list: its buffer, and its pieces to cut it back into fragments.
    done: Option<List<A>>,
    stats: DefragStats,
}

/// How many freed buffers are kept for reuse.
const SPARE: usize = 8;

impl<A: FragFamily> Defrag<A> {
    /// An empty table.
    pub fn new(cfg: DefragConfig) -> Defrag<A> {
        Defrag {
            cfg,
            lists: hashbrown::HashMap::new(),
            order: VecDeque::new(),
            frags: 0,
            bytes: 0,
            spare: Vec::new(),
            whole: (0, 0),
            done: None,
            stats: DefragStats::default(),
        }
    }

    /// Its limits.
    pub fn config(&self) -> &DefragConfig {
        &self.cfg
    }

    /// Its counters.
    pub fn stats(&self) -> DefragStats {
        self.stats
    }

    /// Fragments held now.
    pub fn held(&self) -> usize {
        self.frags
    }

    /// Bytes of datagram buffers held now.
    pub fn held_bytes(&self) -> usize {
        self.bytes
    }

    /// Datagrams being put together now.
    pub fn lists(&self) -> usize {
        self.lists.len()
    }

    fn refuse(&mut self, r: FragDrop) -> FragDrop {
        self.stats.drops[r as usize] += 1;
        r
    }

    /// Takes fragment `frame` (its IP header at `l3_off`, described by `f` from
    /// [`FragFamily::parse`]) at `now`: held, or the last one its datagram needed (then
    /// [`Defrag::datagram`] has the datagram until the next push), or refused and counted.
    pub fn push(
        &mut self,
        frame: &[u8],
        l3_off: usize,
        f: &Fragment<A>,
        now: Instant,
    ) -> Result<Pushed, FragDrop> {
        self.expire(now);
        self.push_expired(frame, l3_off, f, now)
    }

    /// [`Defrag::push`] when the lists whose time is up at `now` are freed already.
    fn push_expired(
        &mut self,
        frame: &[u8],
        l3_off: usize,
        f: &Fragment<A>,
        now: Instant,
    ) -> Result<Pushed, FragDrop> {
        self.stats.fragments += 1;
        self.recycle_done();
        let head = l3_off + f.hdr_len;
        let (Some(hdr), Some(data)) = (frame.get(..head), frame.get(head..head + f.data_len))
        else {
            return Err(self.refuse(FragDrop::Malformed));
        };
        if hdr.len() > MAX_FRAG_HEADERS || l3_off > usize::from(u8::MAX) {
            return Err(self.refuse(FragDrop::Malformed));
        }
        if f.more && (f.data_len % 8 != 0 || f.hdr_len + f.data_len < self.cfg.min_frag) {
            return Err(self.refuse(FragDrop::TooSmall));
        }
        let end = f.end();
        if f.data_len == 0 || f.hdr_len + end > MAX_DATAGRAM {
            return Err(self.refuse(FragDrop::Oversize));
        }
        if self.frags >= self.cfg.max_frags {
            return Err(self.refuse(FragDrop::TableFull));
        }
        if !self.lists.contains_key(&f.key) {
            let (pieces, data) = self.spare.pop().unwrap_or_default();
            self.lists.insert(
                f.key,
                List {
                    key: f.key,
                    first_seen: now,
                    pieces,
                    data,
                    extent: 0,
                    total: None,
                    next_at: 0,
                },
            );
            self.order.push_back((now, f.key));
        }
        match self.insert(hdr, l3_off, data, f) {
            Ok(done) => {
                self.frags += 1;
                if !done {
                    return Ok(Pushed::Held);
                }
                let list = self.remove(&f.key).expect("the list just completed");
                self.assemble(list);
                self.stats.reassembled += 1;
                Ok(Pushed::Complete)
            }
            Err((r, discard)) => {
                // A discarded datagram goes; so does a list this fragment would have begun.
                if discard || self.lists.get(&f.key).is_some_and(|l| l.pieces.is_empty()) {
                    self.drop_list(&f.key);
                }
                Err(self.refuse(r))
            }
        }
    }

    /// Places one fragment's data and headers in its list; `Ok(true)` when the datagram is
    /// then complete; `Err((reason, discard the list))`.
    fn insert(
        &mut self,
        hdr: &[u8],
        l3_off: usize,
        data: &[u8],
        f: &Fragment<A>,
    ) -> Result<bool, (FragDrop, bool)> {
        let (offset, end) = (f.offset, f.end());
        let room = self.cfg.max_bytes.saturating_sub(self.bytes);
        let l = self.lists.get_mut(&f.key).expect("made above");
        // The end the last fragment gives is final; nothing may lie past it.
        let past_total = l.total.is_some_and(|t| end > t || (!f.more && end != t));
        let past_held = !f.more && l.pieces.last().is_some_and(|p| p.end as usize > end);
        if past_total || past_held {
            return Err((FragDrop::Oversize, true));
        }
        let at = l.pieces.partition_point(|p| (p.offset as usize) < offset);
        let same = |p: &Piece| p.offset as usize == offset && p.end as usize == end;
        if l.pieces.get(at).is_some_and(same) {
            return Err((FragDrop::Duplicate, false));
        }
        let before = at.checked_sub(1).and_then(|i| l.pieces.get(i));
        if before.is_some_and(|p| p.end as usize > offset)
            || l.pieces.get(at).is_some_and(|p| (p.offset as usize) < end)
        {
            return Err((FragDrop::Overlap, true));
        }
        if l.pieces.len() >= MAX_FRAGS_PER_DATAGRAM {
            return Err((FragDrop::TooManyFragments, true));
        }
        let grow = end.saturating_sub(l.extent);
        if grow > room {
            return Err((FragDrop::TableFull, l.pieces.is_empty()));
        }
        if FRONT + end > l.data.len() {
            // Doubled (up to the largest datagram), so that fragments coming in order move
            // the payload a few times only; a recycled buffer is mostly big enough already.
            let room = (2 * l.data.len()).clamp(FRONT + end, FRONT + MAX_DATAGRAM);
            let mut bigger = vec![0u8; room].into_boxed_slice();
            if let Some(held) = l.data.get(FRONT..FRONT + l.extent) {
                bigger[FRONT..FRONT + l.extent].copy_from_slice(held);
            }
            l.data = bigger;
        }
        if grow > 0 {
            l.extent = end;
            self.bytes += grow;
        }
        l.data[FRONT + offset..FRONT + end].copy_from_slice(data);
        let mut piece = Piece {
            offset: u32::try_from(offset).unwrap_or(u32::MAX),
            end: u32::try_from(end).unwrap_or(u32::MAX),
            l3_off: u8::try_from(l3_off).unwrap_or(u8::MAX),
            hdr_len: u8::try_from(hdr.len()).unwrap_or(u8::MAX),
            hdr: [0; MAX_FRAG_HEADERS],
        };
        piece.hdr[..hdr.len()].copy_from_slice(hdr);
        l.pieces.insert(at, piece);
        if offset == 0 {
            l.next_at = f.next_at;
        }
        if !f.more {
            l.total = Some(end);
        }
        Ok(l.total.is_some_and(|t| l.covered() == t) && l.pieces[0].offset == 0)
    }

    /// Takes a list out of the table, its counts with it.
    fn remove(&mut self, key: &FragKey<A>) -> Option<List<A>> {
        let l = self.lists.remove(key)?;
        self.frags -= l.pieces.len();
        self.bytes -= l.extent;
        Some(l)
    }

    /// Frees a list, its buffers kept for reuse.
    fn drop_list(&mut self, key: &FragKey<A>) {
        if let Some(l) = self.remove(key) {
            self.keep(l);
        }
    }

    fn keep(&mut self, mut l: List<A>) {
        if self.spare.len() < SPARE {
            l.pieces.clear();
            self.spare.push((l.pieces, l.data));
        }
    }

    fn recycle_done(&mut self) {
        if let Some(l) = self.done.take() {
            self.keep(l);
        }
    }

    /// Frees the lists whose time is up at `now`; returns how many.
    pub fn expire(&mut self, now: Instant) -> usize {
        let mut n = 0;
        while let Some(&(t, key)) = self.order.front() {
            if now.saturating_since(t) < self.cfg.timeout {
                break;
            }
            self.order.pop_front();
            // The list may be gone (completed, discarded) or made anew since.
            if self.lists.get(&key).is_some_and(|l| l.first_seen == t) {
                self.drop_list(&key);
                self.stats.timeouts += 1;
                n += 1;
            }
        }
        // Keys of lists that left early are dropped from the front as they come up; bound
        // the queue too (a list per push at most, so this is rare).
        if self.order.len() > 2 * self.cfg.max_frags + 16 {
            let lists = &self.lists;
            self.order
                .retain(|(t, k)| lists.get(k).is_some_and(|l| l.first_seen == *t));
        }
        n
    }

    /// Makes the complete datagram `l` one frame where its payload lies: the first
    /// fragment's headers, made whole, written just in front of the payload.
    fn assemble(&mut self, mut l: List<A>) {
        let first = l.pieces[0];
        let (l3_off, hdr_len) = (usize::from(first.l3_off), usize::from(first.hdr_len));
        let total = l.total.unwrap_or(0);
        let mut hdr = first.hdr;
        let ip_len = A::unfragment(&mut hdr[l3_off..hdr_len], l.next_at, total);
        let head = l3_off + ip_len;
        l.data[FRONT - head..FRONT].copy_from_slice(&hdr[..head]);
        self.whole = (FRONT - head, head + total);
        self.done = Some(l);
    }

    /// The datagram the last [`Defrag::push`] completed, if it did.
    pub fn datagram(&mut self) -> Option<Datagram<'_, A>> {
        let (start, len) = self.whole;
        let list = self.done.as_mut()?;
        let whole = list.data.get_mut(start..start + len)?;
        Some(Datagram {
            whole,
            pieces: &list.pieces,
            key: list.key,
        })
    }

    /// Lends the buffer of the datagram the last push completed, as a packet buffer whose
    /// frame is the datagram (no copy): until [`Defrag::give_back`], [`Defrag::datagram`] is
    /// `None`, while [`Defrag::refragment_last`] still cuts.
    fn lend(&mut self) -> Option<crate::buf::PacketBuf> {
        let (start, len) = self.whole;
        let l = self.done.as_mut().filter(|l| l.data.len() >= start + len)?;
        let data = std::mem::take(&mut l.data);
        Some(crate::buf::PacketBuf::from_storage(data, start, len))
    }

    /// Takes back the buffer [`Defrag::lend`] lent (to be recycled).
    fn give_back(&mut self, b: crate::buf::PacketBuf) {
        if let Some(l) = self.done.as_mut() {
            l.data = b.into_storage();
        }
    }
}

impl<A: FragFamily> Defrag<A> {
    /// [`Datagram::refragment`] of the datagram the last [`Defrag::push`] completed, cut from
    /// `whole`: that datagram's frame as it is now, wherever it was rewritten (the same
    /// headers' lengths). `None` when the last push completed nothing.
    pub fn refragment_last(
        &self,
        whole: &[u8],
        buf: &mut [u8],
        out: &mut dyn FnMut(&[u8]),
    ) -> Option<(usize, usize)> {
        Some(cut::<A>(&self.done.as_ref()?.pieces, whole, buf, out))
    }
}

/// Cuts datagram `whole` (one frame) back at the boundaries of its `pieces` (see
/// [`Datagram::refragment`]).
fn cut<A: FragFamily>(
    pieces: &[Piece],
    whole: &[u8],
    buf: &mut [u8],
    out: &mut dyn FnMut(&[u8]),
) -> (usize, usize) {
    let Some(first) = pieces.first() else {
        return (0, 0);
    };
    let l3 = usize::from(first.l3_off);
    let data_at = usize::from(first.hdr_len) - A::FRAG_HEADER_LEN;
    let (mut sent, mut skipped) = (0, 0);
    for p in pieces {
        let (h, off) = (usize::from(p.hdr_len), usize::from(p.l3_off));
        let (start, end) = (data_at + p.offset as usize, data_at + p.end as usize);
        let (Some(data), Some(frame), Some(ip)) = (
            whole.get(start..end),
            buf.get_mut(..h + end - start),
            whole.get(l3..),
        ) else {
            skipped += 1;
            continue;
        };
        frame[..h].copy_from_slice(&p.hdr[..h]);
        frame[h..].copy_from_slice(data);
        A::refresh_header(&mut frame[off..h], ip);
        out(frame);
        sent += 1;
    }
    (sent, skipped)
}

impl<A: FragFamily> std::fmt::Debug for Defrag<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Defrag")
            .field("cfg", &self.cfg)
            .field("lists", &self.lists.len())
            .field("frags", &self.frags)
            .field("bytes", &self.bytes)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// A datagram put together: one frame to run conntrack and NAT on, then cut back into
/// its fragments.
pub struct Datagram<'a, A> {
    whole: &'a mut [u8],
    pieces: &'a [Piece],
    key: FragKey<A>,
}

impl<A: FragFamily> std::fmt::Debug for Datagram<'_, A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Datagram")
            .field("key", &self.key)
            .field("len", &self.whole.len())
            .field("fragments", &self.pieces.len())
            .finish()
    }
}

impl<A: FragFamily> Datagram<'_, A> {
    /// The datagram as one frame: the first fragment's link header, its IP header made
    /// whole (IPv4: no MF, offset 0, total length and checksum; IPv6: the fragment header
    /// taken out), then the whole payload.
    pub fn frame(&self) -> &[u8] {
        self.whole
    }

    /// The frame, to rewrite (NAT) in place; its length stays.
    pub fn frame_mut(&mut self) -> &mut [u8] {
        self.whole
    }

    /// Its identity.
    pub fn key(&self) -> FragKey<A> {
        self.key
    }

    /// How many fragments it came in.
    pub fn fragments(&self) -> usize {
        self.pieces.len()
    }

    /// The largest fragment it came in (bytes of IP packet): Linux's `frag_max_size`.
    pub fn max_frag_size(&self) -> usize {
        self.pieces
            .iter()
            .map(|p| usize::from(p.hdr_len) - usize::from(p.l3_off) + (p.end - p.offset) as usize)
            .max()
            .unwrap_or(0)
    }

    /// Cuts the datagram, as [`Datagram::frame`] is now (rewritten or not), back into its
    /// original fragments, in order of offset: each under its own link and IP headers, with
    /// the datagram's addresses (and, over IPv4, a new header checksum), carrying the
    /// datagram's bytes at its offset. `out` gets each frame (written into `buf`, which
    /// must hold the largest; a fragment that does not fit is skipped and counted in the
    /// result's second half).
    pub fn refragment(&self, buf: &mut [u8], out: &mut dyn FnMut(&[u8])) -> (usize, usize) {
        cut::<A>(self.pieces, self.whole, buf, out)
    }
}

/// The per-family steps of a worker's reassembly ([`Frags`]): which table is the family's.
pub(crate) trait FragsOf: FragFamily {
    /// The family's table in `f`.
    fn table(f: &mut Frags) -> &mut Defrag<Self>;
}

impl FragsOf for std::net::Ipv4Addr {
    #[inline]
    fn table(f: &mut Frags) -> &mut Defrag<Self> {
        &mut f.v4
    }
}

impl FragsOf for std::net::Ipv6Addr {
    #[inline]
    fn table(f: &mut Frags) -> &mut Defrag<Self> {
        &mut f.v6
    }
}

/// The largest frame a datagram put together can be: 65,535 bytes of IP packet behind the
/// longest link header a fragment may keep.
pub(crate) const WHOLE_FRAME: usize = MAX_DATAGRAM + MAX_FRAG_HEADERS;

/// A worker's reassembly state: a table per family, and the buffer of the fragment that
/// completed a datagram, kept aside while the datagram (in its list's own buffer, lent as a
/// packet buffer: no copy) goes the rest of its way.
#[derive(Debug)]
pub(crate) struct Frags {
    v4: Defrag<std::net::Ipv4Addr>,
    v6: Defrag<std::net::Ipv6Addr>,
    /// The fragment's buffer, and whether the datagram in its place is IPv6.
    aside: Option<(crate::buf::PacketBuf, bool)>,
    /// Where a datagram is cut back into fragments (made on first use).
    scratch: Vec<u8>,
    /// The largest fragment the last datagram put together came in (bytes of IP packet,
    /// Linux's `frag_max_size`).
    max: usize,
}

impl Default for Frags {
    fn default() -> Frags {
        Frags {
            v4: Defrag::new(DefragConfig::default_for::<std::net::Ipv4Addr>()),
            v6: Defrag::new(DefragConfig::default_for::<std::net::Ipv6Addr>()),
            aside: None,
            scratch: Vec::new(),
            max: 0,
        }
    }
}

impl Frags {
    /// Frees the datagrams whose time is up at `now`: how many fragments went.
    pub(crate) fn expire(&mut self, now: Instant) -> u64 {
        let before = self.v4.held() + self.v6.held();
        self.v4.expire(now);
        self.v6.expire(now);
        (before - (self.v4.held() + self.v6.held())) as u64
    }

    /// Fragments held now, both families.
    pub(crate) fn held(&self) -> usize {
        self.v4.held() + self.v6.held()
    }

    /// Takes fragment `b` (IP header at `l3`, of family `A`) at `now`, first freeing the
    /// family's datagrams whose time is up. When it completes its datagram, `b` becomes the
    /// datagram (in the buffer it was put together in) and the fragment's buffer is kept
    /// aside until [`Frags::restore`] gives it back.
    pub(crate) fn take<A: FragsOf>(
        &mut self,
        b: &mut crate::buf::PacketBuf,
        l3: usize,
        now: Instant,
    ) -> Result<Taken, crate::stats::DropReason> {
        let t = A::table(self);
        let f = match A::parse(b.frame().get(l3..).unwrap_or(&[]), 0) {
            Ok(Some(f)) => f,
            Ok(None) => return Ok(Taken::NotFragment),
            Err(r) => return Err(t.refuse(r).into()),
        };
        let before = t.held();
        t.expire(now);
        let expired = (before - t.held()) as u64;
        match t.push_expired(b.frame(), l3, &f, now) {
            Err(r) => Err(r.into()),
            Ok(Pushed::Held) => Ok(Taken::Held { expired }),
            Ok(Pushed::Complete) => {
                let max = t.datagram().map_or(0, |d| d.max_frag_size());
                let Some(mut whole) = t.lend() else {
                    return Err(crate::stats::DropReason::FragMalformed);
                };
                whole.port = b.port;
                let frag = std::mem::replace(b, whole);
                self.aside = Some((frag, A::VERSION == 6));
                self.max = max;
                Ok(Taken::Whole { expired })
            }
        }
    }

    /// The largest fragment the last datagram [`Frags::take`] put together came in (bytes of
    /// IP packet: Linux's `frag_max_size`).
    pub(crate) fn max_frag_size(&self) -> usize {
        self.max
    }

    /// Gives the fragment's buffer back in place of the datagram [`Frags::take`] put in `b`
    /// (whose buffer goes back to its table, to be recycled).
    #[cold]
    pub(crate) fn restore(&mut self, b: &mut crate::buf::PacketBuf) {
        if let Some((frag, v6)) = self.aside.take() {
            let whole = std::mem::replace(b, frag);
            if v6 {
                self.v6.give_back(whole);
            } else {
                self.v4.give_back(whole);
            }
        }
    }

    /// Cuts the datagram `whole` (the last one [`Frags::take`] completed, of family `A`,
    /// rewritten or not) back into its fragments, handing each frame to `out`: how many.
    pub(crate) fn refragment<A: FragsOf>(
        &mut self,
        whole: &[u8],
        out: &mut dyn FnMut(&[u8]),
    ) -> usize {
        if self.scratch.len() < WHOLE_FRAME {
            self.scratch.resize(WHOLE_FRAME, 0);
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        let sent = A::table(self)
            .refragment_last(whole, &mut scratch, out)
            .map_or(0, |(sent, _)| sent);
        self.scratch = scratch;
        sent
    }
}

/// What [`Frags::take`] did with a frame.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Taken {
    /// Not a fragment: it goes on as it is.
    NotFragment,
    /// Held until its datagram is complete; `expired` fragments of other datagrams were
    /// freed on the way.
    Held {
        /// Fragments freed at their timeout.
        expired: u64,
    },
    /// It completed its datagram, now in the buffer.
    Whole {
        /// Fragments freed at their timeout.
        expired: u64,
    },
}

impl From<FragDrop> for crate::stats::DropReason {
    fn from(r: FragDrop) -> crate::stats::DropReason {
        use crate::stats::DropReason as D;
        match r {
            FragDrop::Malformed => D::FragMalformed,
            FragDrop::TooSmall => D::FragTooSmall,
            FragDrop::Oversize => D::FragOversize,
            FragDrop::Overlap => D::FragOverlap,
            FragDrop::Duplicate => D::FragDuplicate,
            FragDrop::TooManyFragments => D::FragTooMany,
            FragDrop::TableFull => D::FragTableFull,
        }
    }
}
