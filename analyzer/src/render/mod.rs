//! How findings are shown: pictures, the report's documents, and exports to other tools'
//! formats. Renderers take data and return what they drew (an SVG, a document) or write to a
//! writer they are given (exports); never a path.

pub mod export;
pub mod plot;
pub mod raster;
pub mod report;
