//! A `[[service]]`'s `endpoints`: each item a string `IP:PORT` (a ready endpoint) or an
//! inline table with its EndpointSlice conditions,
//! `{ addr = "10.244.2.2:8080", ready = false, serving = true, terminating = true, local = true }`.

use std::net::{IpAddr, SocketAddr};

use tapyard::nat::EndpointConditions;
use toml::de::{DeTable, DeValue};

use super::super::values::{is_host, is_host6, BadValue};
use super::{Parser, Sec, Val};

/// The keys of an endpoint's inline table.
const KEYS: &[&str] = &["addr", "ready", "serving", "terminating", "local"];

/// An endpoint as read: its address, `local` when given (else it is local when inside one
/// of the node's bridge subnets), its conditions.
pub(super) type EndpointRead = (SocketAddr, Option<bool>, EndpointConditions);

/// `IP:PORT` of a usable host address and a nonzero port.
fn parse_endpoint(e: &str) -> Result<SocketAddr, BadValue> {
    let a = e
        .parse::<SocketAddr>()
        .map_err(|_| BadValue::NotAnEndpoint)?;
    let host = match a.ip() {
        IpAddr::V4(ip) => is_host(ip),
        IpAddr::V6(ip) => is_host6(ip),
    };
    if a.port() == 0 {
        Err(BadValue::PortZero)
    } else if !host {
        Err(BadValue::NotAHost)
    } else {
        Ok(a)
    }
}

impl Parser<'_> {
    /// The `endpoints` array; each item's line is kept as `endpoints.N`. Bad items are
    /// reported (FILE:LINE, the item, the key and the value) and left out.
    pub(super) fn endpoints(&mut self, s: &mut Sec<'_, '_>) -> Vec<EndpointRead> {
        const KEY: &str = "endpoints";
        let Some(v) = self.raw(s, KEY) else {
            return Vec::new();
        };
        let DeValue::Array(items) = v.get_ref() else {
            let t = v.get_ref().type_str();
            let problem = format!("is a {t}, expected an array of IP:PORT strings or tables");
            self.bad(s, KEY, v, &problem);
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let line = self.line(item.span());
            s.lines.fields.push((format!("{KEY}.{i}"), line));
            let read = match item.get_ref() {
                DeValue::String(text) => match parse_endpoint(text) {
                    Ok(a) => Some((a, None, EndpointConditions::READY)),
                    Err(e) => {
                        s.ok = false;
                        let ctx = s.ctx.clone();
                        self.err(line, format!("{ctx}: {KEY}[{i}] = {text:?} {e}"));
                        None
                    }
                },
                DeValue::Table(t) => self.endpoint_table(s, i, t, line),
                other => {
                    let t = other.type_str();
                    let problem = format!("is a {t}, expected an IP:PORT string or a table");
                    self.bad(s, &format!("{KEY}[{i}]"), item, &problem);
                    None
                }
            };
            out.extend(read);
        }
        out
    }

    /// Item `i`, an inline table at `line`.
    fn endpoint_table(
        &mut self,
        s: &mut Sec<'_, '_>,
        i: usize,
        t: &DeTable<'_>,
        line: usize,
    ) -> Option<EndpointRead> {
        let field = format!("endpoints[{i}]");
        let ctx = format!("{}: {field}", s.ctx);
        if !self.unknown_keys(t, &ctx, KEYS) {
            s.ok = false;
        }
        let addr = match t.get("addr") {
            None => {
                s.ok = false;
                self.err(
                    line,
                    format!("{ctx}: missing field `addr` (the endpoint's IP:PORT)"),
                );
                None
            }
            Some(v) => match v.get_ref() {
                DeValue::String(text) => match parse_endpoint(text) {
                    Ok(a) => Some(a),
                    Err(e) => {
                        self.bad(s, &format!("{field}.addr"), v, &e.to_string());
                        None
                    }
                },
                other => {
                    let t = other.type_str();
                    let problem = format!("is a {t}, expected an IP:PORT string");
                    self.bad(s, &format!("{field}.addr"), v, &problem);
                    None
                }
            },
        };
        let mut flag = |key: &str| -> Option<bool> {
            let v: &Val<'_> = t.get(key)?;
            match v.get_ref() {
                DeValue::Boolean(b) => Some(*b),
                other => {
                    let problem = format!("is a {}, expected true or false", other.type_str());
                    self.bad(s, &format!("{field}.{key}"), v, &problem);
                    None
                }
            }
        };
        let d = EndpointConditions::READY;
        let conditions = EndpointConditions {
            ready: flag("ready").unwrap_or(d.ready),
            serving: flag("serving").unwrap_or(d.serving),
            terminating: flag("terminating").unwrap_or(d.terminating),
        };
        let local = flag("local");
        Some((addr?, local, conditions))
    }
}
