//! The one shape of a fold over a trace's records (below the model's other modules, which
//! implement it).

use recorder::trace::Record;

/// A fold of a trace's records, shown each in order: by a pass of its own, beside others in one
/// pass ([`crate::model::Trace::fold_each`]), or riding a replay's pass ([`crate::replay::Rider`]).
pub trait Fold {
    fn observe(&mut self, i: u64, r: &Record);
}
