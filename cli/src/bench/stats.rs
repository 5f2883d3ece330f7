//! Order statistics over rounds: the median and the spread the table reports.

/// Summary of one column over the rounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// First quartile.
    pub q1: f64,
    /// Third quartile.
    pub q3: f64,
}

/// Summarises `values`; `None` when there are none (or only NaNs).
pub fn summarize(values: &[f64]) -> Option<Summary> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(Summary {
        median: quantile(&v, 0.5),
        min: v[0],
        max: v[v.len() - 1],
        q1: quantile(&v, 0.25),
        q3: quantile(&v, 0.75),
    })
}

/// Linear interpolation between closest ranks (the R-7 / numpy default), on sorted `v`.
fn quantile(v: &[f64], q: f64) -> f64 {
    let pos = q * (v.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_an_even_count_is_the_mean_of_the_middle_two() {
        let s = summarize(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!(s.median, 2.5);
        assert_eq!((s.min, s.max), (1.0, 4.0));
        assert_eq!((s.q1, s.q3), (1.75, 3.25));
    }

    #[test]
    fn nans_are_ignored_and_nothing_summarises_to_none() {
        assert_eq!(summarize(&[f64::NAN, 5.0]).unwrap().median, 5.0);
        assert!(summarize(&[]).is_none());
        assert!(summarize(&[f64::NAN]).is_none());
    }
}
