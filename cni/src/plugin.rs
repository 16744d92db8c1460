//! The CNI commands: ADD, DEL, CHECK and VERSION.
//!
//! ADD checks everything it can before it allocates anything (environment, configuration, the
//! namespace, the IPAM plugin's path); once IPAM has handed out a lease, any failure rolls back
//! what was done (the port is removed, the lease released) before the error is returned.
//! DEL is idempotent and needs nothing but the `CNI_*` variables and the configuration.

use crate::args::{CniArgs, Command};
use crate::config::{self, NetConf, SUPPORTED_VERSIONS};
use crate::control::{Client, ControlError};
use crate::error::{CniError, CHECK_FAILED, INVALID_CONFIG, INVALID_ENV, NETNS_CONFIG};
use crate::netlink::{Link, Netlink};
use crate::netns;
use crate::types::{CniResult, Interface, Route};
use crate::{ipam, types::Cidr};
use serde_json::Value;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Runs the command of `args` on the configuration `stdin`; `Some(json)` is what to print.
pub fn run(args: &CniArgs, stdin: &[u8]) -> Result<Option<Value>, CniError> {
    match args.command {
        Command::Version => Ok(Some(version(stdin))),
        Command::Add => {
            let conf = NetConf::parse(stdin)?;
            let result = add(args, &conf, stdin)?.for_version(&conf.cni_version);
            serde_json::to_value(result).map(Some).map_err(|e| {
                CniError::new(crate::error::IO_FAILURE, "cannot encode the result").with_details(e)
            })
        }
        Command::Del => del(args, &NetConf::parse(stdin)?, stdin).map(|()| None),
        Command::Check => check(args, &NetConf::parse(stdin)?, stdin).map(|()| None),
    }
}

/// VERSION's answer; echoes the caller's `cniVersion` when this plugin speaks it.
fn version(stdin: &[u8]) -> Value {
    let asked = config::peek_version(stdin).filter(|v| SUPPORTED_VERSIONS.contains(&v.as_str()));
    serde_json::json!({
        "cniVersion": asked.as_deref().unwrap_or("1.0.0"),
        "supportedVersions": SUPPORTED_VERSIONS,
    })
}

/// The IPAM plugin's executable, if the configuration has an `ipam` section.
fn ipam_exe(args: &CniArgs, conf: &NetConf) -> Result<Option<PathBuf>, CniError> {
    let Some(kind) = &conf.ipam_type else {
        return Ok(None);
    };
    if args.path.is_empty() {
        return Err(CniError::new(
            INVALID_ENV,
            format!("CNI_PATH is not set: it is needed to find the IPAM plugin {kind:?}"),
        ));
    }
    ipam::find_in_path(kind, &args.path).map(Some)
}

/// `CNI_NETNS`, which [`CniArgs::parse`] requires for ADD and CHECK.
fn netns_path(args: &CniArgs) -> Result<&Path, CniError> {
    args.netns
        .as_deref()
        .ok_or_else(|| CniError::new(INVALID_ENV, "CNI_NETNS is not set"))
}

fn add(args: &CniArgs, conf: &NetConf, stdin: &[u8]) -> Result<CniResult, CniError> {
    let path = netns_path(args)?;
    // Before IPAM: a CNI_NETNS that is not a network namespace must not take a lease.
    let ns = netns::open(path)?;
    let exe = ipam_exe(args, conf)?;
    let leased = match &exe {
        Some(exe) => ipam::exec(exe, Command::Add, stdin)?,
        None => CniResult::default(),
    };
    let client = Client::new(&conf.socket);
    attach(args, conf, &client, &ns, path, &leased).map_err(|(err, port_may_exist)| {
        // Roll back; failures here cannot be reported better than the error that caused them.
        if port_may_exist {
            let _ = client.port_del(&args.owner());
        }
        if let Some(exe) = &exe {
            if let Err(e) = ipam::exec(exe, Command::Del, stdin) {
                eprintln!("tapyard-cni: releasing the IPAM lease after a failed ADD: {e}");
            }
        }
        err
    })
}

/// ADD after IPAM: the port from tapyard, then the namespace. The error says whether the
/// port may exist and needs removing.
fn attach(
    args: &CniArgs,
    conf: &NetConf,
    client: &Client,
    ns: &File,
    path: &Path,
    leased: &CniResult,
) -> Result<CniResult, (CniError, bool)> {
    mtu_fits(conf.mtu, leased).map_err(|e| (e, false))?;
    let netns = path.to_string_lossy();
    // The pod's addresses: the daemon pins the port to them (and to its MAC) when the
    // bridge's spoof guard is on.
    let ips = leased.ips.iter().map(|ip| ip.address.addr).collect();
    let port = client
        .port_add(
            &conf.bridge,
            &args.owner(),
            &netns,
            &args.ifname,
            conf.mtu,
            ips,
        )
        .map_err(|e| {
            let may_exist = matches!(e, ControlError::Broken(_));
            (CniError::from(e), may_exist)
        })?;
    let routes = routes_to_install(leased);
    let link = netns::run_in(ns, path, || {
        configure(&args.ifname, conf.mtu, leased, &routes)
    })
    .map_err(|e| (e, true))?;
    let mac = if link.mac.is_empty() {
        port.mac
    } else {
        link.mac
    };
    let mut ips = leased.ips.clone();
    for ip in &mut ips {
        ip.interface = Some(0);
    }
    let dns = if leased.dns.is_empty() {
        conf.dns.clone()
    } else {
        leased.dns.clone()
    };
    Ok(CniResult {
        cni_version: conf.cni_version.clone(),
        interfaces: vec![Interface {
            name: args.ifname.clone(),
            mac,
            sandbox: Some(netns.into_owned()),
        }],
        ips,
        routes,
        dns,
    })
}

/// IPv6 needs an MTU of at least 1280 (RFC 8200 5): below it Linux disables IPv6 on the
/// link and refuses its addresses (`EINVAL`). Checked once IPAM has said which families the
/// pod gets, before tapyard is asked for a port.
fn mtu_fits(mtu: u32, leased: &CniResult) -> Result<(), CniError> {
    const IPV6_MIN_MTU: u32 = 1280;
    match leased.ips.iter().find(|ip| ip.address.addr.is_ipv6()) {
        Some(ip) if mtu < IPV6_MIN_MTU => Err(CniError::new(
            INVALID_CONFIG,
            format!(
                "mtu {mtu} is below IPv6's minimum of {IPV6_MIN_MTU}, and IPAM gave the IPv6 address {}",
                ip.address
            ),
        )),
        _ => Ok(()),
    }
}

/// IPAM's routes, each with a next hop: its own `gw`, else the gateway IPAM gave for an
/// address of the same family, else none (on-link).
fn routes_to_install(leased: &CniResult) -> Vec<Route> {
    leased
        .routes
        .iter()
        .map(|r| {
            let gw = r.gw.or_else(|| {
                leased
                    .ips
                    .iter()
                    .filter(|ip| ip.address.addr.is_ipv4() == r.dst.addr.is_ipv4())
                    .find_map(|ip| ip.gateway)
            });
            Route { dst: r.dst, gw }
        })
        .collect()
}

/// Inside the namespace: MTU, addresses, up, routes (in that order: a route via a gateway
/// needs the subnet's address on an up link).
fn configure(
    ifname: &str,
    mtu: u32,
    leased: &CniResult,
    routes: &[Route],
) -> Result<Link, CniError> {
    let fail =
        |what: String| move |e: std::io::Error| CniError::new(NETNS_CONFIG, what).with_details(e);
    let mut nl = Netlink::open().map_err(fail("cannot open netlink in the namespace".into()))?;
    let link = nl
        .link_by_name(ifname)
        .map_err(fail(format!("cannot look up {ifname}")))?
        .ok_or_else(|| {
            CniError::new(
                NETNS_CONFIG,
                format!("tapyard created the port but {ifname} is not in the namespace"),
            )
        })?;
    nl.set_mtu(link.index, mtu)
        .map_err(fail(format!("cannot set the MTU of {ifname} to {mtu}")))?;
    for ip in &leased.ips {
        nl.add_address(link.index, ip.address)
            .map_err(fail(format!("cannot add {} to {ifname}", ip.address)))?;
    }
    nl.set_up(link.index)
        .map_err(fail(format!("cannot bring {ifname} up")))?;
    for r in routes {
        nl.add_route(link.index, r.dst, r.gw)
            .map_err(fail(format!("cannot add the route {}", describe(r))))?;
    }
    Ok(link)
}

fn describe(r: &Route) -> String {
    match r.gw {
        Some(gw) => format!("{} via {gw}", r.dst),
        None => r.dst.to_string(),
    }
}

fn del(args: &CniArgs, conf: &NetConf, stdin: &[u8]) -> Result<(), CniError> {
    // Remove the port first so the address is not handed out while it still exists.
    let port = match Client::new(&conf.socket).port_del(&args.owner()) {
        // tapyard drops orphaned ports when it starts: nothing to do.
        Ok(_) | Err(ControlError::Unreachable(_)) => Ok(()),
        Err(e) => Err(CniError::from(e)),
    };
    let lease = ipam_exe(args, conf).and_then(|exe| match exe {
        Some(exe) => ipam::exec(&exe, Command::Del, stdin).map(drop),
        None => Ok(()),
    });
    port.and(lease)
}

fn check(args: &CniArgs, conf: &NetConf, stdin: &[u8]) -> Result<(), CniError> {
    let prev = conf.prev_result.as_ref().ok_or_else(|| {
        CniError::new(
            INVALID_CONFIG,
            "prevResult is missing: CHECK needs the result of ADD",
        )
    })?;
    let path = netns_path(args)?;
    let netns = path.to_string_lossy();
    let ns = netns::open(path)?;
    if let Some(exe) = ipam_exe(args, conf)? {
        ipam::exec(&exe, Command::Check, stdin)?;
    }
    let missing = |msg: String| CniError::new(CHECK_FAILED, msg);
    let index = prev
        .interfaces
        .iter()
        .position(|i| i.name == args.ifname && i.sandbox.as_deref() == Some(&*netns))
        .ok_or_else(|| {
            missing(format!(
                "prevResult has no interface {} in {netns}",
                args.ifname
            ))
        })?;
    let expected_mac = &prev.interfaces[index].mac;
    let addrs: Vec<Cidr> = prev
        .ips
        .iter()
        .filter(|ip| ip.interface.is_none_or(|i| i == index))
        .map(|ip| ip.address)
        .collect();
    let ifname = &args.ifname;
    netns::run_in(&ns, path, || {
        let fail = |what: &str| {
            let what = what.to_string();
            move |e: std::io::Error| CniError::new(NETNS_CONFIG, what).with_details(e)
        };
        let mut nl = Netlink::open().map_err(fail("cannot open netlink in the namespace"))?;
        let link = nl
            .link_by_name(ifname)
            .map_err(fail("cannot look up the interface"))?
            .ok_or_else(|| missing(format!("interface {ifname} is missing from {netns}")))?;
        if !link.up {
            return Err(missing(format!("interface {ifname} is down")));
        }
        if link.mtu != conf.mtu {
            return Err(missing(format!(
                "interface {ifname} has MTU {}, not {}",
                link.mtu, conf.mtu
            )));
        }
        if !expected_mac.is_empty() && !link.mac.eq_ignore_ascii_case(expected_mac) {
            return Err(missing(format!(
                "interface {ifname} has MAC {}, not {expected_mac}",
                link.mac
            )));
        }
        let have = nl
            .addresses(link.index)
            .map_err(fail("cannot list addresses"))?;
        for a in &addrs {
            if !have.contains(a) {
                return Err(missing(format!("interface {ifname} lacks the address {a}")));
            }
        }
        let table = nl.routes().map_err(fail("cannot list routes"))?;
        for r in &prev.routes {
            let dst = r.dst.network();
            let present = table
                .iter()
                .any(|e| e.dst == dst && (r.gw.is_none() || e.gw == r.gw));
            if !present {
                return Err(missing(format!("the route {} is missing", describe(r))));
            }
        }
        Ok(())
    })?;
    match Client::new(&conf.socket).port_show(&args.owner()) {
        Ok(port) if port.name == *ifname => Ok(()),
        Ok(port) => Err(missing(format!(
            "tapyard's port {} is named {}, not {ifname}",
            args.owner(),
            port.name
        ))),
        Err(ControlError::Refused(msg)) => Err(missing(format!(
            "tapyard has no port for {}: {msg}",
            args.owner()
        ))),
        Err(e) => Err(CniError::from(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_mtu_below_1280_is_refused_only_with_an_ipv6_address() {
        let v6: CniResult =
            serde_json::from_str(r#"{"ips":[{"address":"fd00::5/64","gateway":"fd00::1"}]}"#)
                .unwrap();
        let v4: CniResult =
            serde_json::from_str(r#"{"ips":[{"address":"10.244.1.5/24","gateway":"10.244.1.1"}]}"#)
                .unwrap();
        let e = mtu_fits(1279, &v6).unwrap_err();
        assert_eq!(e.code, INVALID_CONFIG);
        assert!(
            e.msg.contains("1280") && e.msg.contains("fd00::5/64"),
            "{}",
            e.msg
        );
        assert!(mtu_fits(1280, &v6).is_ok());
        assert!(mtu_fits(576, &v4).is_ok());
        assert!(mtu_fits(576, &CniResult::default()).is_ok());
    }

    #[test]
    fn routes_take_their_gateway_from_ipam_by_family() {
        let leased: CniResult = serde_json::from_str(
            r#"{"ips":[{"address":"fd00::5/64","gateway":"fd00::1"},
                       {"address":"10.244.1.5/24","gateway":"10.244.1.1"}],
                "routes":[{"dst":"0.0.0.0/0"},{"dst":"::/0"},
                          {"dst":"10.96.0.0/12","gw":"10.244.1.254"}]}"#,
        )
        .unwrap();
        let gws: Vec<String> = routes_to_install(&leased)
            .iter()
            .map(|r| r.gw.map(|g| g.to_string()).unwrap_or_default())
            .collect();
        assert_eq!(gws, ["10.244.1.1", "fd00::1", "10.244.1.254"]);
        let no_gateway = CniResult {
            ips: vec![],
            ..leased
        };
        assert_eq!(routes_to_install(&no_gateway)[0].gw, None);
    }
}
