//! The key reference rendered from the schema (the block that ends `examples/node.toml`).

use super::*;

/// The key reference: every section and key as TOML comments (the block that ends
/// `examples/node.toml`).
pub fn reference() -> String {
    let mut o = String::new();
    o.push_str(REFERENCE_START);
    o.push_str(
        "\n# Generated from cli/src/config/schema.rs (`cargo test -p tapyard-cli` checks it;\n",
    );
    o.push_str("# TAPYARD_BLESS=1 rewrites it). Uncomment a key to change it.\n");
    for s in SECTIONS {
        let head = if s.array {
            format!("[[{}]]", s.name)
        } else {
            format!("[{}]", s.name)
        };
        o.push_str(&format!("#\n# {head:<36}# {}\n", s.help));
        for k in s.keys {
            let (value, note) = match (k.default, k.ty) {
                (Dflt::Required(_), ty) => (example(ty), "required".to_string()),
                (Dflt::Unset(what), ty) => (example(ty), format!("default: {what}")),
                (Dflt::Int(_) | Dflt::Lib(_), _) => {
                    (k.int_default().unwrap_or(0).to_string(), String::new())
                }
                (Dflt::Bool(b), _) => (b.to_string(), String::new()),
                (Dflt::Str(v), _) => (format!("{v:?}"), String::new()),
            };
            let range = match k.ty {
                Ty::Int { lo, hi } | Ty::Secs { lo, hi } => format!("{lo} to {hi}"),
                Ty::Choice { values, .. } => values.join(" | "),
                _ => String::new(),
            };
            let notes: Vec<&str> = [k.help, &range, &note]
                .into_iter()
                .filter(|n| !n.is_empty())
                .collect();
            o.push_str(&format!(
                "# {:<36}# {}\n",
                format!("{} = {value}", k.name),
                notes.join("; ")
            ));
        }
    }
    o
}

fn example(ty: Ty) -> String {
    match ty {
        Ty::Str(e) => format!("{e:?}"),
        Ty::Strings(e) | Ty::Addrs(e) => e.to_string(),
        Ty::Int { lo, .. } | Ty::Secs { lo, .. } => lo.max(1).to_string(),
        Ty::Bool => "false".into(),
        Ty::Choice { values, .. } => format!("{:?}", values[0]),
    }
}
