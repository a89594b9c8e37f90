//! The caching allocator engine. (Being written.)

pub mod config;

use crate::trace::Event;

/// Where the engine's events go. A no-op sink costs nothing: calls are inlined away.
pub trait Sink {
    fn event(&mut self, event: Event);
}

/// Discards every event.
#[derive(Default, Debug, Clone, Copy)]
pub struct NullSink;

impl Sink for NullSink {
    #[inline(always)]
    fn event(&mut self, _event: Event) {}
}

impl Sink for Vec<Event> {
    #[inline]
    fn event(&mut self, event: Event) {
        self.push(event);
    }
}
