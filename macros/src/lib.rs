use proc_macro::TokenStream;
