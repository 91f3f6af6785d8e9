//! Link inferproxy with packed relative relocations (`DT_RELR`; glibc 2.36 and binutils 2.38 on):
//! its TLS, HTTP and serde code holds thousands of pointers the loader relocates at start, and as
//! `RELA` entries the table alone kept about 400 KiB of the binary resident in every inferproxy
//! (docs/performance.md). The code stays position-independent: ASLR is unchanged.

fn main() {
    println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
}
