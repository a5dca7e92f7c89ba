//! Cost of moving a tensor through a shared-memory region compared with a
//! plain `memcpy`, for 4 KiB, 1 MiB and 16 MiB tensors.
//!
//! - `memcpy`: one copy between two heap buffers (the floor).
//! - `shm_write`: a client staging an input ([`ShmRegion::write`]).
//! - `shm_read_into`: a copy out into an existing buffer.
//! - `shm_read`: a copy out into a new buffer, as the server does for each
//!   input ([`ShmRegion::read`]; allocation included).
//! - `shm_write_read`: both copies a tensor makes on its way through.
//! - `server_read` / `server_write`: the same copies by a server, which
//!   opens the client's object and uses `pread`/`pwrite` (never a mapping:
//!   a client truncating its file must not be able to raise `SIGBUS` in
//!   the server). Compare with `shm_read` / `shm_write`.
//! - `server_copy_to`: a server copying one client window into another
//!   ([`ShmRegion::copy_to`], the test worker's `identity` on shared
//!   memory): a `pread` into its mapping of the destination. Compare with
//!   `memcpy`.
//! - `leased_request`: the bytes one leased `identity` request moves, with
//!   no RPC: the caller writes the input into its region's input window,
//!   then a server copies that window into the output window of the same
//!   region (`copy_to`, as the test worker does). Its throughput counts
//!   input + output bytes, as `infermesh bench` and BENCHMARKS.md do, so it
//!   reads directly as the ceiling of the leased path against `memcpy`.
//!
//! The region lives in `/dev/shm` (tmpfs), is touched once before measuring
//! (no first-touch page faults in the figures) and is unlinked at the end.
//!
//! ```sh
//! cargo bench -p infermesh-transport --bench shm_copy -- --warm-up-time 1 --measurement-time 3
//! ```

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use infermesh_transport::ShmRegion;

const SIZES: [(usize, &str); 3] = [(4 << 10, "4KiB"), (1 << 20, "1MiB"), (16 << 20, "16MiB")];

fn shm_copy(c: &mut Criterion) {
    let largest = SIZES[SIZES.len() - 1].0;
    let key = format!("/infermesh-bench-{}", std::process::id());
    let region = ShmRegion::create(&key, largest as u64).expect("create a region in /dev/shm");
    let server = ShmRegion::open(&key, 0, largest as u64).expect("open the region as a server");
    let out_key = format!("/infermesh-bench-out-{}", std::process::id());
    let out = ShmRegion::create(&out_key, largest as u64).expect("create a second region");
    let server_out =
        ShmRegion::open(&out_key, 0, largest as u64).expect("open the second region as a server");
    // One pooled region as the client library lays it out: the input
    // window, then the output window.
    let leased_key = format!("/infermesh-bench-leased-{}", std::process::id());
    let leased = ShmRegion::create(&leased_key, 2 * largest as u64).expect("create a region");
    let src: Vec<u8> = (0..largest).map(|i| i as u8).collect();
    let mut dst = vec![0u8; largest];
    region.write(0, &src).expect("touch every page once");
    out.write(0, &src).expect("touch every page once");
    leased.write(0, &src).expect("touch every page once");
    leased
        .write(largest as u64, &src)
        .expect("touch every page once");

    let mut group = c.benchmark_group("shm_copy");
    for (size, label) in SIZES {
        group.throughput(Throughput::Bytes(size as u64));
        let src = &src[..size];
        group.bench_with_input(BenchmarkId::new("memcpy", label), &size, |b, _| {
            b.iter(|| {
                dst[..size].copy_from_slice(black_box(src));
                black_box(&dst);
            })
        });
        group.bench_with_input(BenchmarkId::new("shm_write", label), &size, |b, _| {
            b.iter(|| region.write(0, black_box(src)).unwrap())
        });
        group.bench_with_input(BenchmarkId::new("shm_read_into", label), &size, |b, _| {
            b.iter(|| {
                region.read_into(0, &mut dst[..size]).unwrap();
                black_box(&dst);
            })
        });
        group.bench_with_input(BenchmarkId::new("shm_read", label), &size, |b, _| {
            b.iter(|| black_box(region.read(0, size as u64).unwrap()))
        });
        group.bench_with_input(BenchmarkId::new("server_read", label), &size, |b, _| {
            b.iter(|| black_box(server.read(0, size as u64).unwrap()))
        });
        group.bench_with_input(BenchmarkId::new("server_write", label), &size, |b, _| {
            b.iter(|| server.write(0, black_box(src)).unwrap())
        });
        group.bench_with_input(BenchmarkId::new("server_copy_to", label), &size, |b, _| {
            b.iter(|| server.copy_to(0, &server_out, 0, size as u64).unwrap())
        });
        group.bench_with_input(BenchmarkId::new("shm_write_read", label), &size, |b, _| {
            b.iter(|| {
                region.write(0, black_box(src)).unwrap();
                region.read_into(0, &mut dst[..size]).unwrap();
                black_box(&dst);
            })
        });
        let leased_in = ShmRegion::open(&leased_key, 0, size as u64).expect("the input window");
        let leased_out =
            ShmRegion::open(&leased_key, largest as u64, size as u64).expect("the output window");
        group.throughput(Throughput::Bytes(2 * size as u64));
        group.bench_with_input(BenchmarkId::new("leased_request", label), &size, |b, _| {
            b.iter(|| {
                leased.write(0, black_box(src)).unwrap();
                leased_in.copy_to(0, &leased_out, 0, size as u64).unwrap();
            })
        });
    }
    group.finish();
}

criterion_group!(benches, shm_copy);
criterion_main!(benches);
