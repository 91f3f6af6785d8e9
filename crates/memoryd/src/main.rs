//! `memoryd serve --config FILE` and `memoryd check --config FILE`.

fn main() -> std::process::ExitCode {
    memoryd::daemon::main()
}

/// The C library's `log`, for SQLite: FTS5's ranking (`bm25`) is memoryd's only caller of the
/// math library, and loading libm for it kept about 300 kB of libm resident in every memoryd
/// (its start-up resolves its own functions for the CPU). Defined here, from the `libm` crate
/// (rust-lang's port of musl's), the linker needs no libm at all (docs/performance.md).
#[unsafe(no_mangle)]
pub extern "C" fn log(x: f64) -> f64 {
    libm::log(x)
}

#[cfg(test)]
mod tests {
    use super::log;

    #[test]
    fn log_agrees_with_the_standard_natural_logarithm_to_the_last_bit_or_one() {
        for x in [
            1e-300,
            1e-9,
            0.5,
            1.0,
            2.0,
            std::f64::consts::E,
            10.0,
            12_345.678,
            1e300,
        ] {
            let (ours, std) = (log(x), x.ln());
            assert!(
                (ours - std).abs() <= std.abs() * f64::EPSILON,
                "log({x}) = {ours}, std says {std}"
            );
        }
    }

    #[test]
    fn log_of_zero_is_minus_infinity_and_of_a_negative_number_not_a_number() {
        assert_eq!(log(0.0), f64::NEG_INFINITY);
        assert!(log(-1.0).is_nan());
        assert_eq!(log(1.0), 0.0);
    }
}
