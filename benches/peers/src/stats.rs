//! Percentiles and the raw samples' summary.

/// The `q` quantile (0..=1) of sorted `values` (nearest rank).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// `values` sorted.
pub fn sorted(values: &[f64]) -> Vec<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

/// The median of `values`.
pub fn median(values: &[f64]) -> f64 {
    quantile(&sorted(values), 0.5)
}

/// One line: n, min, p10, p50, p90, p99, max, mean.
pub fn summary(values: &[f64]) -> String {
    let s = sorted(values);
    if s.is_empty() {
        return "n 0".into();
    }
    let mean = s.iter().sum::<f64>() / s.len() as f64;
    format!(
        "n {}, min {:.1}, p10 {:.1}, p50 {:.1}, p90 {:.1}, p99 {:.1}, max {:.1}, mean {:.1}",
        s.len(),
        s[0],
        quantile(&s, 0.10),
        quantile(&s, 0.50),
        quantile(&s, 0.90),
        quantile(&s, 0.99),
        s[s.len() - 1],
        mean
    )
}

/// Values with `decimals` decimals, comma-separated.
pub fn list(values: &[f64], decimals: usize) -> String {
    values
        .iter()
        .map(|v| format!("{v:.decimals$}"))
        .collect::<Vec<_>>()
        .join(", ")
}
