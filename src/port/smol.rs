//! A smoltcp host on an in-memory port: a real TCP/IP stack in process, no root needed.

use smoltcp::iface::{Config, Interface, PollResult, SocketSet};
use smoltcp::phy::{self, Device, DeviceCapabilities, Medium};
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpCidr, Ipv4Address};

use super::MemPort;
use crate::buf::{PacketBuf, DEFAULT_FRAME_ROOM};
use crate::time::Instant;
use crate::wire::mac::MacAddr;

/// Adapts one end of an in-memory pair to smoltcp's `Device`.
struct MemDevice {
    port: MemPort,
}

struct RxTok<'a> {
    buf: Option<PacketBuf>,
    port: &'a MemPort,
}

struct TxTok<'a> {
    port: &'a MemPort,
}

impl phy::RxToken for RxTok<'_> {
    fn consume<R, F: FnOnce(&[u8]) -> R>(mut self, f: F) -> R {
        let buf = self.buf.take().expect("token holds a frame");
        let r = f(buf.frame());
        self.port.recycle(buf);
        r
    }
}

impl phy::TxToken for TxTok<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut tmp = [0u8; DEFAULT_FRAME_ROOM];
        let len = len.min(tmp.len());
        let r = f(&mut tmp[..len]);
        // A full queue drops the frame, as a NIC would; TCP retransmits.
        let _ = self.port.send_frame(&tmp[..len]);
        r
    }
}

impl Device for MemDevice {
    type RxToken<'a> = RxTok<'a>;
    type TxToken<'a> = TxTok<'a>;

    fn receive(
        &mut self,
        _t: smoltcp::time::Instant,
    ) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        let buf = self.port.recv_frame()?;
        Some((
            RxTok {
                buf: Some(buf),
                port: &self.port,
            },
            TxTok { port: &self.port },
        ))
    }

    fn transmit(&mut self, _t: smoltcp::time::Instant) -> Option<Self::TxToken<'_>> {
        Some(TxTok { port: &self.port })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut c = DeviceCapabilities::default();
        c.medium = Medium::Ethernet;
        c.max_transmission_unit = 1514;
        c.max_burst_size = Some(32);
        c
    }
}

/// A smoltcp `Interface` and `SocketSet` attached to one end of an in-memory pair; the other
/// end goes to the datapath. Create sockets in [`SmolHost::sockets`] and call
/// [`SmolHost::poll`] with the current time to make progress.
pub struct SmolHost {
    /// The host's interface (addresses, routes).
    pub iface: Interface,
    /// The host's sockets.
    pub sockets: SocketSet<'static>,
    device: MemDevice,
    mac: MacAddr,
}

impl std::fmt::Debug for SmolHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmolHost")
            .field("mac", &self.mac)
            .field("addrs", &self.iface.ip_addrs())
            .finish()
    }
}

impl SmolHost {
    /// A host with Ethernet address `mac` and IPv4 address `cidr` (with its prefix), sending
    /// through `port`, with a default route via `gateway` if given.
    pub fn new(
        mac: MacAddr,
        cidr: IpCidr,
        gateway: Option<Ipv4Address>,
        port: MemPort,
        now: Instant,
    ) -> SmolHost {
        let mut device = MemDevice { port };
        let mut cfg = Config::new(HardwareAddress::Ethernet(EthernetAddress(mac.0)));
        cfg.random_seed = mac.to_u64();
        let mut iface = Interface::new(cfg, &mut device, now.into());
        iface.update_ip_addrs(|a| {
            let _ = a.push(cidr);
        });
        if let Some(gw) = gateway {
            let _ = iface.routes_mut().add_default_ipv4_route(gw);
        }
        SmolHost {
            iface,
            sockets: SocketSet::new(Vec::new()),
            device,
            mac,
        }
    }

    /// The host's MAC address.
    pub fn mac(&self) -> MacAddr {
        self.mac
    }

    /// Processes received frames and socket work due at `now`. Returns true if socket state may
    /// have changed.
    pub fn poll(&mut self, now: Instant) -> bool {
        self.iface
            .poll(now.into(), &mut self.device, &mut self.sockets)
            == PollResult::SocketStateChanged
    }

    /// The time at which the host next needs polling, if any timer is pending.
    pub fn poll_at(&mut self, now: Instant) -> Option<Instant> {
        self.iface
            .poll_at(now.into(), &self.sockets)
            .map(|t| Instant::from_micros(t.total_micros().max(0) as u64))
    }
}
