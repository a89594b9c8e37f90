//! How findings are shown: pictures, the report's documents, and exports to other tools'
//! formats. Renderers take data and a writer.

pub mod export;
pub mod plot;
pub mod raster;
pub mod report;
