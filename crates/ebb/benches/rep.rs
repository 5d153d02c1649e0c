//! The cost of reaching a core's representative: `cargo bench -p splitos-ebb`. Compares an
//! Ebb call (thread-local table, generation and type checks) with calling the same object
//! through an `Rc` held by the caller, and with a `Mutex` shared by every core (what a policy
//! behind a lock costs uncontended).
use std::cell::Cell;
use std::hint::black_box;
use std::rc::Rc;
use std::sync::Mutex;
use std::time::Instant;

use splitos_ebb::Ebb;

const CALLS: u64 = 20_000_000;

fn per_call(f: impl Fn()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t0 = Instant::now();
        for _ in 0..CALLS {
            f();
        }
        best = best.min(t0.elapsed().as_nanos() as f64 / CALLS as f64);
    }
    best
}

fn main() {
    let ebb = Ebb::new("bench", |_| Cell::new(0u64));
    let direct = Rc::new(Cell::new(0u64));
    let locked = Mutex::new(0u64);
    let e = per_call(|| ebb.call(|c| c.set(black_box(c.get() + 1))));
    let d = per_call(|| direct.set(black_box(direct.get() + 1)));
    let m = per_call(|| *locked.lock().unwrap() += black_box(1));
    println!("representative call through the Ebb: {e:.2} ns");
    println!("the same call through an Rc:          {d:.2} ns");
    println!("an uncontended Mutex instead:         {m:.2} ns");
}
