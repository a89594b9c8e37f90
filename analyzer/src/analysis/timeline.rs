//! A streaming, per-pixel-column downsampled time series: memory bounded by the number of
//! columns, whatever the number of events, and the true extremes always kept.
//!
//! Values arrive in x order (time or event index). Each column covers `width` units of x and
//! keeps, per series, its first, minimum, maximum and last value with where each happened.
//! When a new x would need more than `max_columns` columns, the width doubles and neighbouring
//! columns merge pairwise (min of mins, max of maxes), so no extreme is ever lost.
//!
//! Worked example, `max_columns` = 4, one series: values 5, 9, 1, 4, 7 at x = 0..5.
//! Width 1 holds x = 0..3 in four columns. x = 4 needs a fifth column: the width becomes 2,
//! columns {0,1} and {2,3} merge into (min 5, max 9) and (min 1, max 4), and x = 4 opens a third
//! column. Drawing first → extremes in order → last per column gives 5, 9, 1, 4, 7: the polyline
//! passes through the peak 9 although there are fewer columns than points.
//!
//! In [`Mode::AtMaxOfFirst`] the other series keep their values at the moment series 0 was
//! highest in the column, for stacked pictures whose top edge must show the true peak while
//! the bands stay consistent with it.

/// One value and where it happened.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub x: u64,
    /// Order of arrival, to order extremes that share an x.
    pub seq: u64,
    pub value: f64,
}

/// What a column keeps of one series.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    pub first: Sample,
    pub min: Sample,
    pub max: Sample,
    pub last: Sample,
}

impl Bucket {
    fn new(s: Sample) -> Self {
        Bucket { first: s, min: s, max: s, last: s }
    }
    fn offer(&mut self, s: Sample) {
        if s.value < self.min.value {
            self.min = s;
        }
        if s.value > self.max.value {
            self.max = s;
        }
        self.last = s;
    }
    /// `self` is the earlier column.
    fn merge(&mut self, later: &Bucket) {
        if later.min.value < self.min.value {
            self.min = later.min;
        }
        if later.max.value > self.max.value {
            self.max = later.max;
        }
        self.last = later.last;
    }
}

/// How the series other than the first are folded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every series keeps its own extremes.
    Envelope,
    /// Series 1.. keep the values they had when series 0 was at its column maximum (in `max`).
    AtMaxOfFirst,
}

/// The fold. See the module documentation.
#[derive(Debug, Clone)]
pub struct Timeline {
    names: Vec<String>,
    mode: Mode,
    max_columns: u64,
    x0: Option<u64>,
    x_last: u64,
    seq: u64,
    width: u64,
    /// Column keys (column start = x0 + key * width), ascending.
    keys: Vec<u64>,
    /// `keys.len() * names.len()` buckets, column-major.
    buckets: Vec<Bucket>,
}

/// The folded series, ready to draw.
#[derive(Debug, Clone)]
pub struct Downsampled {
    pub names: Vec<String>,
    pub mode: Mode,
    /// The x of the first value (0 when empty).
    pub x0: u64,
    pub x_last: u64,
    /// x units per column.
    pub width: u64,
    pub keys: Vec<u64>,
    pub buckets: Vec<Bucket>,
    /// Values pushed.
    pub samples: u64,
}

impl Timeline {
    /// A fold of the series `names` into at most `max_columns` columns (at least 2).
    pub fn new(names: &[&str], max_columns: usize, mode: Mode) -> Self {
        Timeline {
            names: names.iter().map(|s| s.to_string()).collect(),
            mode,
            max_columns: max_columns.max(2) as u64,
            x0: None,
            x_last: 0,
            seq: 0,
            width: 1,
            keys: Vec::new(),
            buckets: Vec::new(),
        }
    }

    /// Adds the values of every series at `x`. An x below the previous one counts as the
    /// previous one (timestamps of a trace never go back, but a damaged one might).
    #[inline]
    pub fn push(&mut self, x: u64, values: &[f64]) {
        debug_assert_eq!(values.len(), self.names.len());
        let x0 = *self.x0.get_or_insert(x);
        let x = x.max(self.x_last);
        self.x_last = x;
        let dx = x - x0;
        while dx / self.width >= self.max_columns {
            self.coarsen();
        }
        let key = dx / self.width;
        let seq = self.seq;
        self.seq += 1;
        let n = self.names.len();
        if self.keys.last() == Some(&key) {
            let base = self.buckets.len() - n;
            let col = &mut self.buckets[base..];
            let s0 = Sample { x, seq, value: values[0] };
            let new_max = s0.value > col[0].max.value;
            col[0].offer(s0);
            for (i, b) in col.iter_mut().enumerate().skip(1) {
                let s = Sample { x, seq, value: values[i] };
                match self.mode {
                    Mode::Envelope => b.offer(s),
                    Mode::AtMaxOfFirst => {
                        b.last = s;
                        if new_max {
                            b.max = s;
                        }
                        b.min.value = b.min.value.min(s.value);
                    }
                }
            }
        } else {
            self.keys.push(key);
            self.buckets.extend(values.iter().map(|&v| Bucket::new(Sample { x, seq, value: v })));
        }
    }

    /// Doubles the column width, merging neighbouring columns.
    fn coarsen(&mut self) {
        let n = self.names.len();
        self.width *= 2;
        let mut out = 0usize;
        for i in 0..self.keys.len() {
            let key = self.keys[i] / 2;
            if out > 0 && self.keys[out - 1] == key {
                let (done, rest) = self.buckets.split_at_mut(i * n);
                let target = &mut done[(out - 1) * n..out * n];
                let first_takes = rest[0].max.value > target[0].max.value;
                for (j, (t, b)) in target.iter_mut().zip(&rest[..n]).enumerate() {
                    if j > 0 && self.mode == Mode::AtMaxOfFirst {
                        if first_takes {
                            t.max = b.max;
                        }
                        t.min.value = t.min.value.min(b.min.value);
                        t.last = b.last;
                    } else {
                        t.merge(b);
                    }
                }
            } else {
                self.keys[out] = key;
                if out != i {
                    for j in 0..n {
                        self.buckets[out * n + j] = self.buckets[i * n + j];
                    }
                }
                out += 1;
            }
        }
        self.keys.truncate(out);
        self.buckets.truncate(out * n);
    }

    pub fn finish(self) -> Downsampled {
        Downsampled {
            names: self.names,
            mode: self.mode,
            x0: self.x0.unwrap_or(0),
            x_last: self.x_last,
            width: self.width,
            keys: self.keys,
            buckets: self.buckets,
            samples: self.seq,
        }
    }
}

impl Downsampled {
    pub fn columns(&self) -> usize {
        self.keys.len()
    }

    /// The buckets of series `s`, one per column.
    pub fn series(&self, s: usize) -> impl Iterator<Item = &Bucket> + '_ {
        self.buckets.iter().skip(s).step_by(self.names.len().max(1))
    }

    /// The largest value of series `s` (its true maximum in [`Mode::Envelope`]).
    pub fn max(&self, s: usize) -> f64 {
        self.series(s).map(|b| b.max.value).fold(f64::NEG_INFINITY, f64::max)
    }

    /// The polyline of series `s`: per column its first value, its extremes in the order they
    /// happened, and its last value (repeats removed). At most 4 points per column.
    pub fn points(&self, s: usize) -> Vec<(u64, f64)> {
        let mut out = Vec::with_capacity(self.columns() * 4);
        for b in self.series(s) {
            let mut pts = [b.first, b.min, b.max, b.last];
            if self.mode == Mode::AtMaxOfFirst && s > 0 {
                pts = [b.first, b.max, b.max, b.last];
            }
            pts.sort_by_key(|p| p.seq);
            let mut prev: Option<u64> = None;
            for p in pts {
                if prev != Some(p.seq) {
                    out.push((p.x, p.value));
                    prev = Some(p.seq);
                }
            }
        }
        out
    }

    /// For stacked pictures: per column, the value of series `s` when series 0 was highest.
    pub fn at_max_of_first(&self, s: usize) -> Vec<(u64, f64)> {
        let n = self.names.len();
        self.keys
            .iter()
            .enumerate()
            .map(|(c, _)| (self.buckets[c * n].max.x, self.buckets[c * n + s].max.value))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worked_example() {
        let mut t = Timeline::new(&["v"], 4, Mode::Envelope);
        for (x, v) in [5.0, 9.0, 1.0, 4.0, 7.0].into_iter().enumerate() {
            t.push(x as u64, &[v]);
        }
        let d = t.finish();
        assert_eq!(d.width, 2);
        assert_eq!(d.columns(), 3);
        let ys: Vec<f64> = d.points(0).into_iter().map(|p| p.1).collect();
        assert_eq!(ys, vec![5.0, 9.0, 1.0, 4.0, 7.0]);
    }

    #[test]
    fn a_single_spike_survives_a_million_points() {
        let mut t = Timeline::new(&["v", "w"], 1000, Mode::Envelope);
        for i in 0..1_000_000u64 {
            let v = if i == 777_777 { 1e12 } else { (i % 1000) as f64 };
            t.push(i * 3, &[v, -v]);
        }
        let d = t.finish();
        assert!(d.columns() <= 1000 && d.columns() >= 500, "{}", d.columns());
        assert_eq!(d.max(0), 1e12);
        assert!(d.points(0).contains(&(777_777 * 3, 1e12)));
        assert!(d.points(1).contains(&(777_777 * 3, -1e12)));
        assert!(d.points(0).len() <= 4 * d.columns());
    }

    #[test]
    fn stacked_mode_keeps_bands_at_the_top() {
        let mut t = Timeline::new(&["total", "a"], 2, Mode::AtMaxOfFirst);
        t.push(0, &[1.0, 1.0]);
        t.push(1, &[10.0, 3.0]);
        t.push(2, &[2.0, 2.0]);
        t.push(3, &[4.0, 4.0]);
        let d = t.finish();
        // Width 2: columns {0, 1} and {2, 3}; band `a` taken where `total` peaked in each.
        assert_eq!(d.columns(), 2);
        assert_eq!(d.max(0), 10.0);
        assert_eq!(d.at_max_of_first(1), vec![(1, 3.0), (3, 4.0)]);
    }
}
