//! The device's durability and fault semantics, command by command.

use crate::*;

const LEN: u64 = 64 << 20;

fn dev(profile: &str, plan: FaultPlan) -> SimDevice {
    SimDevice::new(
        Profile::load(profile).expect("profile"),
        Media::memory(LEN),
        plan,
        false,
    )
}

fn write(d: &SimDevice, off: u64, data: &[u8], fua: bool) -> Result<(), SimError> {
    let t = d.submit_write(off, data, fua)?;
    d.complete(t)
}

fn read(d: &SimDevice, off: u64, len: usize) -> Result<Vec<u8>, SimError> {
    let mut b = vec![0u8; len];
    let t = d.submit_read(off, &mut b)?;
    d.complete(t)?;
    Ok(b)
}

fn durable(d: &SimDevice, off: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    d.read_durable(off, &mut b);
    b
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13) ^ seed)
        .collect()
}

fn lose_everything() -> FaultPlan {
    FaultPlan {
        persist_unflushed: 0.0,
        ..FaultPlan::none()
    }
}

#[test]
fn only_flush_or_fua_makes_writes_durable_without_plp() {
    let d = dev("tlc-noplp", lose_everything());
    let (a, b, c) = (pattern(1, 8192), pattern(2, 8192), pattern(3, 8192));
    write(&d, 0, &a, false).expect("write");
    assert_eq!(
        read(&d, 0, 8192).expect("read"),
        a,
        "a completed write reads back"
    );
    d.submit_flush().and_then(|t| d.complete(t)).expect("flush");
    write(&d, 8192, &b, false).expect("write");
    write(&d, 16384, &c, true).expect("fua write");
    d.power_cut();
    assert_eq!(read(&d, 0, 4096), Err(SimError::PowerOff));
    d.power_on();
    assert_eq!(read(&d, 0, 8192).expect("read"), a, "flushed");
    assert_eq!(read(&d, 8192, 8192).expect("read"), vec![0; 8192], "lost");
    assert_eq!(read(&d, 16384, 8192).expect("read"), c, "FUA");
}

#[test]
fn power_loss_protection_keeps_completed_writes() {
    let d = dev("tlc", lose_everything());
    let a = pattern(1, 8192);
    write(&d, 4096, &a, false).expect("write");
    // In flight at the cut: lost even with PLP (never acknowledged).
    let t = d.submit_write(65536, &a, false).expect("submit");
    d.power_cut();
    assert_eq!(d.complete(t), Err(SimError::PowerOff));
    d.power_on();
    assert_eq!(read(&d, 4096, 8192).expect("read"), a);
    assert_eq!(read(&d, 65536, 8192).expect("read"), vec![0; 8192]);
}

#[test]
fn a_torn_write_leaves_each_sector_old_or_new() {
    for seed in 0..50 {
        let plan = FaultPlan {
            seed,
            ..FaultPlan::none()
        }
        .at(2, Fault::PowerCut);
        let d = dev("tlc-noplp", plan);
        let old = pattern(7, 64 << 10);
        let new = pattern(9, 64 << 10);
        write(&d, 0, &old, true).expect("old"); // command 0
        d.submit_flush().and_then(|t| d.complete(t)).expect("flush"); // 1
        assert_eq!(
            d.submit_write(0, &new, true).err(),
            Some(SimError::PowerOff)
        ); // 2: cut
        d.power_on();
        let got = durable(&d, 0, 64 << 10);
        let mut olds = 0;
        for (i, s) in got.chunks(4096).enumerate() {
            let r = i * 4096..(i + 1) * 4096;
            assert!(
                s == &old[r.clone()] || s == &new[r],
                "seed {seed} sector {i} mixed"
            );
            olds += (s == &old[i * 4096..(i + 1) * 4096]) as usize;
        }
        assert!(olds < 16 || seed > 0, "some seeds persist something");
    }
}

#[test]
fn same_seed_same_trace() {
    let run = |seed: u64| {
        let plan = FaultPlan {
            seed,
            bit_flip: 0.1,
            uncorrectable: 0.05,
            program_fail: 0.05,
            misdirect: 0.05,
            flush_fail: 0.1,
            latency_spike: 0.1,
            ..FaultPlan::none()
        };
        let d = dev("qlc-noplp", plan);
        for i in 0..300u64 {
            let off = (i * 7919 % 1000) * 4096;
            let _ = write(&d, off, &pattern(i as u8, 8192), i % 3 == 0);
            let _ = read(&d, off, 4096);
            if i % 10 == 0 {
                let _ = d.submit_flush().and_then(|t| d.complete(t));
            }
        }
        (
            d.trace_hash(),
            d.stats().now_ns,
            format!("{:?}", d.stats().faults),
        )
    };
    assert_eq!(run(5), run(5));
    assert_ne!(run(5).0, run(6).0);
}

#[test]
fn read_faults() {
    let d = dev(
        "tlc",
        FaultPlan {
            bit_flips_max: 3,
            ..FaultPlan::none()
        }
        .at(1, Fault::Uncorrectable)
        .at(2, Fault::BitFlip),
    );
    let a = pattern(4, 16384);
    write(&d, 0, &a, false).expect("write"); // 0
    assert_eq!(read(&d, 0, 16384), Err(SimError::Uncorrectable(0))); // 1
    let got = read(&d, 0, 16384).expect("read"); // 2: flipped, reported fine
    let bits: u32 = got.iter().zip(&a).map(|(x, y)| (x ^ y).count_ones()).sum();
    assert!((1..=3).contains(&bits), "{bits} bits flipped");
    assert_eq!(
        read(&d, 0, 16384).expect("read"),
        a,
        "the medium itself is intact"
    );
}

#[test]
fn write_faults() {
    let d = dev(
        "tlc",
        FaultPlan::none()
            .at(0, Fault::ProgramFail)
            .at(2, Fault::Misdirect)
            .at(4, Fault::FlushFail)
            .at(5, Fault::Full)
            .at(7, Fault::SpaceBack),
    );
    let a = pattern(5, 8192);
    assert_eq!(write(&d, 0, &a, false), Err(SimError::ProgramFail(0))); // 0
    assert!(read(&d, 0, 8192).expect("read") == vec![0; 8192]); // 1
    write(&d, 8192, &a, false).expect("misdirected, reported fine"); // 2
    assert!(read(&d, 8192, 8192).expect("read") != a, "landed elsewhere"); // 3
    assert_eq!(
        d.submit_flush().and_then(|t| d.complete(t)),
        Err(SimError::FlushFail)
    ); // 4
    assert_eq!(write(&d, 0, &a, false), Err(SimError::NoSpace)); // 5
    assert!(read(&d, 0, 4096).is_ok(), "reads go on when full"); // 6
    write(&d, 0, &a, false).expect("space is back"); // 7
    assert!(read(&d, 0, 8192).expect("read") == a); // 8
    let f = d.stats().faults;
    assert_eq!(
        (f["programfail"], f["misdirect"], f["flushfail"], f["full"]),
        (1, 1, 1, 1)
    );
}

#[test]
fn a_failed_flush_makes_nothing_durable() {
    let d = dev("tlc-noplp", lose_everything().at(1, Fault::FlushFail));
    let a = pattern(6, 8192);
    write(&d, 0, &a, false).expect("write"); // 0
    assert!(d.submit_flush().is_err()); // 1
    d.power_cut();
    d.power_on();
    assert_eq!(read(&d, 0, 8192).expect("read"), vec![0; 8192]);
}

#[test]
fn unaligned_and_out_of_range_are_refused() {
    let d = dev("tlc", FaultPlan::none());
    assert!(matches!(
        d.submit_write(100, &[0; 4096], false),
        Err(SimError::Invalid { .. })
    ));
    assert!(matches!(
        d.submit_write(LEN, &[0; 4096], false),
        Err(SimError::Invalid { .. })
    ));
}
