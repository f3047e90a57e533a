//! ds4-model: the GGUF reader, DS4 hyper-parameters, tensor table checks and the graph builder.
pub mod gguf;
