//! ds4-model: the GGUF reader, DS4 hyper-parameters, tensor table checks and the graph builder.
pub mod builder;
pub mod gguf;
pub mod gguf_writer;
pub mod inspect;
pub mod hparams;
pub mod synthetic;
pub mod tokenizer;
pub mod chat;
pub mod quantize;
