//! A hit-ratio curve over capacity in blocks (increasing capacities): read at a capacity,
//! and inverted (the capacity a hit ratio needs).

/// Hit ratio of a curve at `capacity` (linear between points; flat past the last).
pub fn curve_at(points: &[(f64, f64)], capacity: f64) -> f64 {
    match points.iter().position(|&(c, _)| c >= capacity) {
        None => points.last().map_or(0.0, |p| p.1),
        Some(0) => points[0].1 * (capacity / points[0].0.max(1e-9)).min(1.0),
        Some(i) => {
            let ((c0, h0), (c1, h1)) = (points[i - 1], points[i]);
            h0 + (h1 - h0) * (capacity - c0) / (c1 - c0)
        }
    }
}

/// The smallest capacity at which a curve reaches `target`, or `None` if it never does.
pub fn capacity_for(points: &[(f64, f64)], target: f64) -> Option<f64> {
    let i = points.iter().position(|&(_, h)| h >= target)?;
    if i == 0 {
        let (c, h) = points[0];
        return Some(c * (target / h.max(1e-12)).min(1.0));
    }
    let ((c0, h0), (c1, h1)) = (points[i - 1], points[i]);
    Some(c0 + (c1 - c0) * (target - h0) / (h1 - h0).max(1e-12))
}
