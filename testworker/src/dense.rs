//! The `dense` model: one fully connected layer with fixed weights and a
//! `tanh` nonlinearity.
//!
//! Input `INPUT0` is FP32 `[batch, 16]`, output `OUTPUT0` is FP32 `[batch, 4]`:
//!
//! ```text
//! W[i][j] = ((i * 4 + j) * 37 mod 29) / 14 - 1        i in 0..16, j in 0..4
//! b[j]    = (j - 1.5) / 10                            j in 0..4
//! y[n][j] = tanh( (Σ_i x[n][i] · W[i][j]) / 4 + b[j] )
//! ```
//!
//! The weights come from a fixed formula rather than a random generator, so
//! any test, in any language, recomputes them in one line (the Python interop
//! test does exactly that with numpy). Arithmetic is `f32`, summed in
//! increasing `i`; compare with a relative tolerance of about 1e-5.

/// Input tensor name.
pub const INPUT: &str = "INPUT0";
/// Output tensor name.
pub const OUTPUT: &str = "OUTPUT0";
/// Features per input row.
pub const IN_FEATURES: usize = 16;
/// Values per output row.
pub const OUT_FEATURES: usize = 4;
/// Name of the model a worker serves when no `--model` is given.
pub const DEFAULT_MODEL: &str = "dense";

/// The weight `W[i][j]`.
pub fn weight(i: usize, j: usize) -> f32 {
    (((i * OUT_FEATURES + j) * 37) % 29) as f32 / 14.0 - 1.0
}

/// The bias `b[j]`.
pub fn bias(j: usize) -> f32 {
    (j as f32 - 1.5) / 10.0
}

/// Computes the model over `input`, a row-major `[batch, 16]` buffer.
/// Returns the row-major `[batch, 4]` output. `input.len()` must be a
/// multiple of 16 (callers validate shapes first).
pub fn forward(input: &[f32]) -> Vec<f32> {
    // Weights by output column, so each output is one dot product over a row.
    let mut columns = [[0f32; IN_FEATURES]; OUT_FEATURES];
    for (j, column) in columns.iter_mut().enumerate() {
        for (i, w) in column.iter_mut().enumerate() {
            *w = weight(i, j);
        }
    }
    let mut out = Vec::with_capacity(input.len() / IN_FEATURES * OUT_FEATURES);
    for x in input.chunks_exact(IN_FEATURES) {
        for (j, column) in columns.iter().enumerate() {
            // Summed in increasing i, as documented.
            let acc = x
                .iter()
                .zip(column)
                .fold(0f32, |acc, (xi, wij)| acc + xi * wij);
            out.push((acc / 4.0 + bias(j)).tanh());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_are_in_range_and_fixed() {
        assert_eq!(weight(0, 0), -1.0);
        assert_eq!(weight(0, 1), 8.0 / 14.0 - 1.0);
        for i in 0..IN_FEATURES {
            for j in 0..OUT_FEATURES {
                assert!((-1.0..=1.0).contains(&weight(i, j)));
            }
        }
    }

    #[test]
    fn zero_input_gives_tanh_of_bias() {
        let out = forward(&[0.0; 32]);
        assert_eq!(out.len(), 8);
        for (k, v) in out.iter().enumerate() {
            assert_eq!(*v, bias(k % 4).tanh());
        }
    }

    #[test]
    fn rows_are_independent() {
        let row: Vec<f32> = (0..16).map(|i| i as f32 / 8.0 - 1.0).collect();
        let one = forward(&row);
        let two = forward(&[row.clone(), row].concat());
        assert_eq!(two[..4], one[..]);
        assert_eq!(two[4..], one[..]);
    }
}
