//! One pass over toml's spanned document: every section read against its [`schema`]
//! description (allowed keys, required keys, types, ranges, defaults), every problem recorded
//! as a [`Diag`] with its line.

use std::collections::HashSet;
use std::ops::Range;
use std::time::Duration;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::schema::{self, Dflt, Section, Ty};
use super::values::{parse_iface_addr_any, BadValue, IpCidr};
use super::{Cidr, Cidr6, Config, Diag, Lines, Located, NodeCfg};

mod endpoints;
mod sections;

/// Byte offsets to 1-based line numbers.
pub(super) struct LineMap {
    starts: Vec<usize>,
}

impl LineMap {
    /// The line starts of `src`.
    pub(super) fn new(src: &str) -> LineMap {
        let mut starts = vec![0];
        starts.extend(src.match_indices('\n').map(|(i, _)| i + 1));
        LineMap { starts }
    }

    /// The line of byte `offset`.
    pub(super) fn line(&self, offset: usize) -> usize {
        self.starts.partition_point(|&s| s <= offset)
    }
}

type Val<'i> = Spanned<DeValue<'i>>;

/// Reads a document, collecting diagnostics.
pub(super) struct Parser<'a> {
    pub(super) lines: &'a LineMap,
    pub(super) diags: &'a mut Vec<Diag>,
}

/// A table being read: its description and the lines of what was read.
struct Sec<'t, 'i> {
    tbl: &'t DeTable<'i>,
    schema: &'static Section,
    ctx: String,
    lines: Lines,
    ok: bool,
}

fn show(v: &DeValue<'_>) -> String {
    match v {
        DeValue::String(s) => format!("{s:?}"),
        DeValue::Integer(i) => i.to_string(),
        DeValue::Float(f) => f.to_string(),
        DeValue::Boolean(b) => b.to_string(),
        other => format!("<{}>", other.type_str()),
    }
}

impl Parser<'_> {
    fn line(&self, span: Range<usize>) -> usize {
        self.lines.line(span.start)
    }

    fn err(&mut self, line: usize, msg: String) {
        self.diags.push(Diag {
            line,
            warning: false,
            msg,
        });
    }

    /// Starts reading `tbl` as `schema`: every key it does not describe is an error.
    fn sec<'t, 'i>(
        &mut self,
        tbl: &'t DeTable<'i>,
        span: Range<usize>,
        ctx: String,
        schema: &'static Section,
    ) -> Sec<'t, 'i> {
        let allowed = schema.names();
        let ok = self.unknown_keys(tbl, &ctx, &allowed);
        Sec {
            tbl,
            schema,
            lines: Lines {
                table: self.line(span),
                fields: Vec::new(),
            },
            ctx,
            ok,
        }
    }

    /// Reports every key of `tbl` not in `allowed`; true when there was none.
    fn unknown_keys(&mut self, tbl: &DeTable<'_>, ctx: &str, allowed: &[&str]) -> bool {
        let mut ok = true;
        for k in tbl.keys() {
            if !allowed.contains(&k.get_ref().as_ref()) {
                ok = false;
                let line = self.line(k.span());
                self.err(
                    line,
                    format!(
                        "{ctx}: unknown field `{}` (expected one of: {})",
                        k.get_ref(),
                        allowed.join(", ")
                    ),
                );
            }
        }
        ok
    }

    /// The value of `key`, recording its line; a missing required key is reported.
    fn raw<'t, 'i>(&mut self, s: &mut Sec<'t, 'i>, key: &'static str) -> Option<&'t Val<'i>> {
        let Some((k, v)) = s.tbl.get_key_value(key) else {
            if let Dflt::Required(what) = s.schema.key(key).default {
                s.ok = false;
                let (line, ctx) = (s.lines.table, s.ctx.clone());
                self.err(line, format!("{ctx}: missing field `{key}` ({what})"));
            }
            return None;
        };
        let line = self.line(k.span());
        s.lines.fields.push((key.to_string(), line));
        Some(v)
    }

    fn bad(&mut self, s: &mut Sec<'_, '_>, key: &str, v: &Val<'_>, problem: &str) {
        s.ok = false;
        let line = self.line(v.span());
        let ctx = s.ctx.clone();
        self.err(
            line,
            format!("{ctx}: {key} = {} {problem}", show(v.get_ref())),
        );
    }

    fn str_of<'t>(&mut self, s: &mut Sec<'_, '_>, key: &str, v: &'t Val<'_>) -> Option<&'t str> {
        match v.get_ref() {
            DeValue::String(x) => Some(x.as_ref()),
            other => {
                let t = other.type_str();
                self.bad(s, key, v, &format!("is a {t}, expected a string"));
                None
            }
        }
    }

    /// A string key parsed by `f` (whose error says what is wrong with the value).
    fn text<T>(
        &mut self,
        s: &mut Sec<'_, '_>,
        key: &'static str,
        f: impl Fn(&str) -> Result<T, BadValue>,
    ) -> Option<T> {
        let v = self.raw(s, key)?;
        let text = self.str_of(s, key, v)?;
        match f(text) {
            Ok(x) => Some(x),
            Err(e) => {
                self.bad(s, key, v, &e.to_string());
                None
            }
        }
    }

    /// An integer key (or seconds) within its described range; `None` when absent or bad.
    fn given_int(&mut self, s: &mut Sec<'_, '_>, key: &'static str) -> Option<i64> {
        let (Ty::Int { lo, hi } | Ty::Secs { lo, hi }) = s.schema.key(key).ty else {
            panic!("{key} is not an integer in the schema");
        };
        let v = self.raw(s, key)?;
        match v.get_ref() {
            DeValue::Integer(i) => match i64::from_str_radix(i.as_str(), i.radix()) {
                Ok(n) if (lo..=hi).contains(&n) => Some(n),
                _ => {
                    let problem = format!("is out of range, expected {lo} to {hi}");
                    self.bad(s, key, v, &problem);
                    None
                }
            },
            other => {
                let t = other.type_str();
                self.bad(s, key, v, &format!("is a {t}, expected an integer"));
                None
            }
        }
    }

    /// An integer key, or its described default.
    fn int(&mut self, s: &mut Sec<'_, '_>, key: &'static str) -> i64 {
        let given = self.given_int(s, key);
        given
            .or_else(|| s.schema.key(key).int_default())
            .unwrap_or_else(|| panic!("{key} has no default in the schema"))
    }

    /// An integer key, or its described default, as the type it configures: the schema's range
    /// fits that type, so the conversion fails only for a schema bug.
    fn int_as<T: TryFrom<i64>>(&mut self, s: &mut Sec<'_, '_>, key: &'static str) -> T {
        let n = self.int(s, key);
        T::try_from(n).unwrap_or_else(|_| panic!("{key}: the schema's range does not fit its type"))
    }

    /// A given integer key as the type it configures (see [`Self::int_as`]).
    fn given_int_as<T: TryFrom<i64>>(
        &mut self,
        s: &mut Sec<'_, '_>,
        key: &'static str,
    ) -> Option<T> {
        let n = self.given_int(s, key)?;
        Some(
            T::try_from(n)
                .unwrap_or_else(|_| panic!("{key}: the schema's range does not fit its type")),
        )
    }

    /// Seconds, or the described default.
    fn secs(&mut self, s: &mut Sec<'_, '_>, key: &'static str) -> Duration {
        Duration::from_secs(self.int(s, key) as u64)
    }

    /// A boolean key, or its described default.
    fn boolean(&mut self, s: &mut Sec<'_, '_>, key: &'static str) -> bool {
        let Dflt::Bool(default) = s.schema.key(key).default else {
            panic!("{key} is not a boolean with a default in the schema");
        };
        let Some(v) = self.raw(s, key) else {
            return default;
        };
        match v.get_ref() {
            DeValue::Boolean(b) => *b,
            other => {
                let t = other.type_str();
                self.bad(s, key, v, &format!("is a {t}, expected true or false"));
                default
            }
        }
    }

    /// One of the described values (an alias gives the value it stands for), or the default.
    fn choice(&mut self, s: &mut Sec<'_, '_>, key: &'static str) -> &'static str {
        let k = s.schema.key(key);
        let (
            Ty::Choice {
                what,
                values,
                aliases,
            },
            Dflt::Str(default),
        ) = (k.ty, k.default)
        else {
            panic!("{key} is not a choice with a default in the schema");
        };
        self.text(s, key, |t| {
            values
                .iter()
                .copied()
                .find(|v| *v == t)
                .or_else(|| aliases.iter().find(|(a, _)| *a == t).map(|(_, v)| *v))
                .ok_or(BadValue::NotAChoice { what, values })
        })
        .unwrap_or(default)
    }

    /// An array of strings, each parsed by `f`; each item's line is kept as `key.N`.
    fn list<T>(
        &mut self,
        s: &mut Sec<'_, '_>,
        key: &'static str,
        f: impl Fn(&str) -> Result<T, BadValue>,
    ) -> Vec<T> {
        let Some(v) = self.raw(s, key) else {
            return Vec::new();
        };
        let DeValue::Array(items) = v.get_ref() else {
            let t = v.get_ref().type_str();
            let problem = format!("is a {t}, expected an array of strings");
            self.bad(s, key, v, &problem);
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let line = self.line(item.span());
            s.lines.fields.push((format!("{key}.{i}"), line));
            let Some(text) = self.str_of(s, key, item) else {
                continue;
            };
            match f(text) {
                Ok(x) => out.push(x),
                Err(e) => {
                    s.ok = false;
                    let ctx = s.ctx.clone();
                    self.err(line, format!("{ctx}: {key}[{i}] = {text:?} {e}"));
                }
            }
        }
        out
    }

    /// A string, or an array of strings, each parsed by `f` into a value of either family;
    /// at most one of each family. A list item's line is kept as `key.N`. `None` when absent
    /// or when nothing could be read.
    fn addrs<T: Copy + std::fmt::Display>(
        &mut self,
        s: &mut Sec<'_, '_>,
        key: &'static str,
        f: impl Fn(&str) -> Result<T, BadValue>,
        is_v6: impl Fn(&T) -> bool,
    ) -> Option<(Option<T>, Option<T>)> {
        let v = self.raw(s, key)?;
        let items: Vec<(usize, Option<usize>, &str)> = match v.get_ref() {
            DeValue::String(x) => vec![(self.line(v.span()), None, x.as_ref())],
            DeValue::Array(items) => {
                if items.is_empty() {
                    self.bad(
                        s,
                        key,
                        v,
                        "is an empty list, expected an address or a list of one per family",
                    );
                    return None;
                }
                let mut out = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    let line = self.line(item.span());
                    s.lines.fields.push((format!("{key}.{i}"), line));
                    if let Some(t) = self.str_of(s, key, item) {
                        out.push((line, Some(i), t));
                    }
                }
                out
            }
            other => {
                let t = other.type_str();
                let problem = format!("is a {t}, expected a string or an array of strings");
                self.bad(s, key, v, &problem);
                return None;
            }
        };
        let (mut v4, mut v6): (Option<T>, Option<T>) = (None, None);
        let ctx = s.ctx.clone();
        for (line, i, text) in items {
            let field = match i {
                Some(i) => format!("{key}[{i}]"),
                None => key.to_string(),
            };
            match f(text) {
                Ok(x) => {
                    let (slot, fam) = if is_v6(&x) {
                        (&mut v6, "IPv6")
                    } else {
                        (&mut v4, "IPv4")
                    };
                    match slot {
                        Some(first) => {
                            s.ok = false;
                            let msg = format!("{ctx}: {field} = {text:?} is a second {fam} value after {first} (at most one per family)");
                            self.err(line, msg);
                        }
                        None => *slot = Some(x),
                    }
                }
                Err(e) => {
                    s.ok = false;
                    self.err(line, format!("{ctx}: {field} = {text:?} {e}"));
                }
            }
        }
        (v4.is_some() || v6.is_some()).then_some((v4, v6))
    }

    /// An interface's `address`: IPv4, IPv6 or both (at least one when given).
    fn iface_addrs(&mut self, s: &mut Sec<'_, '_>) -> Option<(Option<Cidr>, Option<Cidr6>)> {
        let (v4, v6) = self.addrs(s, "address", parse_iface_addr_any, IpCidr::is_v6)?;
        let v6 = v6.and_then(|c| match c {
            IpCidr::V6(c) => Some(c),
            IpCidr::V4(_) => None,
        });
        let v4 = v4.and_then(|c| match c {
            IpCidr::V4(c) => Some(c),
            IpCidr::V6(_) => None,
        });
        Some((v4, v6))
    }

    /// The `[[<section>.<key>]]` tables under table `t`, read as `s`: `key` is not a key of
    /// `s`'s schema, so the unknown-field error [`Self::sec`] reported for it is taken back.
    fn sub_tables<'t, 'i>(
        &mut self,
        s: &mut Sec<'_, '_>,
        t: &'t DeTable<'i>,
        key: &'static str,
    ) -> Vec<(&'t DeTable<'i>, Range<usize>)> {
        let unknown = format!("{}: unknown field `{key}`", s.ctx);
        let n = self.diags.len();
        self.diags.retain(|d| !d.msg.starts_with(&unknown));
        if self.diags.len() != n {
            let mut allowed = s.schema.names();
            allowed.push(key);
            s.ok = t.keys().all(|k| allowed.contains(&k.get_ref().as_ref()));
        }
        self.tables(t, key)
    }

    fn tables<'t, 'i>(
        &mut self,
        doc: &'t DeTable<'i>,
        key: &str,
    ) -> Vec<(&'t DeTable<'i>, Range<usize>)> {
        let Some((k, v)) = doc.get_key_value(key) else {
            return Vec::new();
        };
        match v.get_ref() {
            DeValue::Array(items) => {
                let mut out = Vec::new();
                for it in items.iter() {
                    match it.get_ref() {
                        DeValue::Table(t) => out.push((t, it.span())),
                        _ => {
                            let line = self.line(it.span());
                            self.err(
                                line,
                                format!("`{key}` must be written [[{key}]] (an array of tables)"),
                            );
                        }
                    }
                }
                out
            }
            DeValue::Table(_) => {
                let line = self.line(k.span());
                self.err(
                    line,
                    format!("`[{key}]` must be written [[{key}]] (there may be several)"),
                );
                Vec::new()
            }
            _ => {
                let line = self.line(k.span());
                self.err(line, format!("`{key}` must be written [[{key}]]"));
                Vec::new()
            }
        }
    }

    fn table<'t, 'i>(
        &mut self,
        doc: &'t DeTable<'i>,
        key: &str,
    ) -> Option<(&'t DeTable<'i>, Range<usize>)> {
        let (k, v) = doc.get_key_value(key)?;
        match v.get_ref() {
            DeValue::Table(t) => Some((t, v.span())),
            _ => {
                let line = self.line(k.span());
                self.err(line, format!("`{key}` must be a table written [{key}]"));
                None
            }
        }
    }

    /// Every `[[kind]]` read by `read`; the names of those left out (a required field missing
    /// or bad) go to `broken`.
    fn items<T>(
        &mut self,
        doc: &DeTable<'_>,
        section: &'static Section,
        broken: &mut HashSet<String>,
        mut read: impl FnMut(&mut Self, Sec<'_, '_>, &DeTable<'_>) -> Option<Located<T>>,
    ) -> Vec<Located<T>> {
        let mut out = Vec::new();
        for (i, (t, span)) in self.tables(doc, section.name).into_iter().enumerate() {
            let ctx = match section.name {
                "route" => match t.get("to").and_then(|v| v.get_ref().as_str()) {
                    Some(to) => format!("route to {to}"),
                    None => format!("route #{}", i + 1),
                },
                "neighbor" => match t.get("ip").and_then(|v| v.get_ref().as_str()) {
                    Some(ip) => format!("neighbor {ip}"),
                    None => format!("neighbor #{}", i + 1),
                },
                "snat" => match t.get("src").and_then(|v| v.get_ref().as_str()) {
                    Some(src) => format!("snat from {src}"),
                    None => format!("snat #{}", i + 1),
                },
                kind => match t.get("name").and_then(|v| v.get_ref().as_str()) {
                    Some(n) => format!("{kind} {n:?}"),
                    None => format!("{kind} #{}", i + 1),
                },
            };
            let s = self.sec(t, span, ctx, section);
            match read(self, s, t) {
                Some(x) => out.push(x),
                None => {
                    if let Some(n) = raw_name(t) {
                        broken.insert(n);
                    }
                }
            }
        }
        out
    }

    /// The config as far as it could be read (items missing a required field are left out
    /// and their names, if any, returned); errors are in `self.diags`.
    pub(super) fn document(&mut self, doc: &DeTable<'_>) -> (Config, HashSet<String>) {
        let top: Vec<&str> = schema::SECTIONS.iter().map(|s| s.name).collect();
        self.unknown_keys(doc, "top level", &top);
        let node = match self.table(doc, "node") {
            Some((t, span)) => self.node(t, span),
            None => {
                if !doc.contains_key("node") {
                    self.err(
                        1,
                        "missing table [node] (with at least name and cluster_cidr)".into(),
                    );
                }
                None
            }
        };
        let mut broken = HashSet::new();
        let bridges = self.items(doc, &schema::BRIDGE, &mut broken, Self::bridge);
        let uplinks = self.items(doc, &schema::UPLINK, &mut broken, Self::uplink);
        let hosts = self.items(doc, &schema::HOST, &mut broken, Self::host);
        let routes = self.items(doc, &schema::ROUTE, &mut broken, Self::route);
        let neighbors = self.items(doc, &schema::NEIGHBOR, &mut broken, Self::neighbor);
        // A Service endpoint at the host port's address (a hostNetwork server) is on this node.
        let local: Vec<Cidr> = bridges
            .iter()
            .filter_map(|b| b.address)
            .chain(
                hosts
                    .iter()
                    .filter_map(|h| h.address)
                    .map(|addr| Cidr { addr, len: 32 }),
            )
            .collect();
        let local6: Vec<Cidr6> = bridges
            .iter()
            .filter_map(|b| b.address6)
            .chain(
                hosts
                    .iter()
                    .filter_map(|h| h.address6)
                    .map(|addr| Cidr6 { addr, len: 128 }),
            )
            .collect();
        let services = self.items(doc, &schema::SERVICE, &mut broken, |p, s, t| {
            p.service(s, t, &local, &local6)
        });
        let vxlans = self.items(doc, &schema::VXLAN, &mut broken, Self::vxlan);
        let masquerade = self.table(doc, "masquerade").and_then(|(t, span)| {
            let s = self.sec(t, span, "[masquerade]".into(), &schema::MASQUERADE);
            self.masquerade(s)
        });
        let snats = self.items(doc, &schema::SNAT, &mut broken, Self::snat);
        let (conntrack, max_entries6) = match self.table(doc, "conntrack") {
            Some((t, span)) => {
                let s = self.sec(t, span, "[conntrack]".into(), &schema::CONNTRACK);
                self.conntrack(s)
            }
            None => self.conntrack(self.empty(&schema::CONNTRACK)),
        };
        let neigh = match self.table(doc, "neigh") {
            Some((t, span)) => {
                let s = self.sec(t, span, "[neigh]".into(), &schema::NEIGH);
                self.neigh(s)
            }
            None => self.neigh(self.empty(&schema::NEIGH)),
        };
        let node = node.unwrap_or_else(|| NodeCfg {
            name: String::new(),
            cluster_cidr: None,
            cluster_cidr6: None,
            workers: None,
            busy_poll_us: 0,
            socket: None,
            state_dir: None,
            node_port_range: (30000, 32767),
            offload: true,
            service_cidr: None,
            service_cidr6: None,
            masquerade_all: false,
            random_fully: false,
            node_port_addresses: Vec::new(),
            healthz_port: 10256,
        });
        let config = Config {
            node,
            bridges,
            uplinks,
            hosts,
            routes,
            neighbors,
            services,
            vxlans,
            masquerade,
            snats,
            conntrack,
            max_entries6,
            neigh,
        };
        (config, broken)
    }

    /// An absent section: every key takes its default.
    fn empty(&self, schema: &'static Section) -> Sec<'static, 'static> {
        static EMPTY: std::sync::OnceLock<DeTable<'static>> = std::sync::OnceLock::new();
        Sec {
            tbl: EMPTY.get_or_init(DeTable::new),
            schema,
            ctx: format!("[{}]", schema.name),
            lines: Lines::default(),
            ok: true,
        }
    }
}

/// A string key's described default, parsed.
fn default_str<T>(s: &Sec<'_, '_>, key: &str, f: impl Fn(&str) -> Result<T, BadValue>) -> T {
    match s.schema.key(key).default {
        Dflt::Str(d) => f(d).unwrap_or_else(|e| panic!("{key}'s default {d:?} {e}")),
        _ => panic!("{key} has no string default in the schema"),
    }
}

/// The `name` of a table as written, even when it is not a valid name (so that the item is
/// still cross-checked; the name's own error is reported).
fn raw_name(t: &DeTable<'_>) -> Option<String> {
    t.get("name")
        .and_then(|v| v.get_ref().as_str())
        .filter(|n| !n.is_empty())
        .map(str::to_string)
}
