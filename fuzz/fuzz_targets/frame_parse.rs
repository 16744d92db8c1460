//! The frame parsers on arbitrary bytes: the fast-path L2 parse and the full-layer summary
//! must never panic, and the L2 parse must agree with the summary.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tapyard::wire::{EthMeta, Summary};

fuzz_target!(|data: &[u8]| {
    let meta = EthMeta::parse(data);
    let s = Summary::parse(data);
    let _ = s.to_string();
    if let Ok(m) = meta {
        assert!(usize::from(m.l3) <= data.len());
        assert_eq!(s.eth, Some(m));
    }
});
