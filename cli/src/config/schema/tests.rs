//! The schema against examples/node.toml's reference block and its own defaults.

use super::*;

const EXAMPLE_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/node.toml");

/// The block at the end of `examples/node.toml` is what the description renders. With
/// `TAPYARD_BLESS=1` the test writes it instead.
#[test]
fn example_reference_block_matches_the_schema() {
    let text = std::fs::read_to_string(EXAMPLE_PATH).unwrap();
    let want = reference();
    let at = text.find(REFERENCE_START);
    if std::env::var_os("TAPYARD_BLESS").is_some() {
        let head = &text[..at.unwrap_or(text.len())];
        std::fs::write(EXAMPLE_PATH, format!("{head}{want}")).unwrap();
        return;
    }
    let at = at.expect("examples/node.toml has no key reference block");
    assert!(
        text[at..] == want,
        "examples/node.toml's key reference differs from the schema; run\n  TAPYARD_BLESS=1 cargo test -p tapyard-cli example_reference\nto rewrite it. Expected:\n{want}"
    );
}

#[test]
fn defaults_are_in_range_and_choices_known() {
    for s in SECTIONS {
        for k in s.keys {
            match (k.ty, k.int_default()) {
                (Ty::Int { lo, hi } | Ty::Secs { lo, hi }, Some(d)) => {
                    assert!((lo..=hi).contains(&d), "{}.{}", s.name, k.name)
                }
                (Ty::Choice { values, .. }, _) => {
                    if let Dflt::Str(d) = k.default {
                        assert!(values.contains(&d), "{}.{}", s.name, k.name);
                    }
                }
                _ => {}
            }
        }
    }
}
