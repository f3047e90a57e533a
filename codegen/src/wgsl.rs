//! WGSL compute shaders (run through wgpu; validated here with naga).
//!
//! Binding layout, group 0, in param order: one storage buffer per buffer param (the
//! output `read_write`, inputs `read`), then one uniform `Ds4Params` holding the item
//! count and every scalar param in order, each 4 bytes: `usize` as u32, `i32`, `F` as
//! f32, `bool` as u32 (0 or 1; uniforms cannot hold bool). One invocation per work item:
//! dispatch `ceil(items / 64)` workgroups; invocations past the item count return.
//!
//! WGSL has no 64-bit integers, so `usize` is u32 here: buffers past 2^32 elements need
//! another target.

use crate::render::{call, escape, f32_digits, prec, Code, Dialect};
use ds4_ir::kir::{Builtin, Elem, Function, Kernel, Lit, ParamKind, Ty};

pub struct Wgsl;

/// Invocations per workgroup.
pub const WORKGROUP_SIZE: u32 = 64;

/// WGSL keywords, reserved words a Rust name could hit, type names and the builtin
/// functions (module-scope buffers share the namespace with them).
const RESERVED: &[&str] = &[
    "alias",
    "break",
    "case",
    "const",
    "const_assert",
    "continue",
    "continuing",
    "default",
    "diagnostic",
    "discard",
    "else",
    "enable",
    "false",
    "fn",
    "for",
    "if",
    "let",
    "loop",
    "override",
    "requires",
    "return",
    "struct",
    "switch",
    "true",
    "var",
    "while",
    "array",
    "atomic",
    "bool",
    "f16",
    "f32",
    "i32",
    "mat2x2",
    "mat3x3",
    "mat4x4",
    "ptr",
    "sampler",
    "texture",
    "u32",
    "vec2",
    "vec3",
    "vec4",
    "as",
    "async",
    "auto",
    "await",
    "become",
    "cast",
    "catch",
    "class",
    "do",
    "enum",
    "export",
    "extern",
    "filter",
    "final",
    "goto",
    "impl",
    "import",
    "inline",
    "layout",
    "macro",
    "match",
    "meta",
    "mod",
    "module",
    "move",
    "mut",
    "namespace",
    "new",
    "null",
    "of",
    "operator",
    "package",
    "pub",
    "ref",
    "self",
    "set",
    "shared",
    "static",
    "super",
    "target",
    "this",
    "trait",
    "type",
    "typedef",
    "union",
    "unsafe",
    "use",
    "where",
    "with",
    "yield",
    "abs",
    "acos",
    "all",
    "any",
    "asin",
    "atan",
    "atan2",
    "bitcast",
    "ceil",
    "clamp",
    "cos",
    "cosh",
    "cross",
    "degrees",
    "distance",
    "dot",
    "exp",
    "exp2",
    "floor",
    "fma",
    "fract",
    "frexp",
    "ldexp",
    "length",
    "log",
    "log2",
    "max",
    "min",
    "mix",
    "modf",
    "normalize",
    "pow",
    "radians",
    "reflect",
    "round",
    "saturate",
    "select",
    "sign",
    "sin",
    "sinh",
    "smoothstep",
    "sqrt",
    "step",
    "tan",
    "tanh",
    "trunc",
    "arrayLength",
    "main",
];

impl Dialect for Wgsl {
    fn ty(&self, t: Ty) -> &'static str {
        match t {
            Ty::Usize => "u32",
            Ty::I32 => "i32",
            Ty::F => "f32",
            Ty::Bool => "bool",
        }
    }

    fn lit(&self, l: Lit) -> Code {
        match l {
            Lit::Usize(v) => Code::atom(format!("{v}u")),
            Lit::I32(v) if v < 0 => Code::new(format!("{v}i"), prec::UNARY),
            Lit::I32(v) => Code::atom(format!("{v}i")),
            Lit::Bool(b) => Code::atom(format!("{b}")),
            // WGSL has no infinite literals; the bit pattern is exact.
            Lit::F(v) if v == f64::NEG_INFINITY => Code::atom("bitcast<f32>(0xff800000u)"),
            Lit::F(v) if v == f64::INFINITY => Code::atom("bitcast<f32>(0x7f800000u)"),
            Lit::F(v) => {
                let t = format!("{}f", f32_digits(v));
                let p = if t.starts_with('-') { prec::UNARY } else { prec::ATOM };
                Code::new(t, p)
            }
        }
    }

    fn cast(&self, to: Ty, arg: Code) -> Code {
        // i32 → u32 keeps the bits, as Rust's `as usize` does modulo 2^32.
        call(self.ty(to), &[arg])
    }

    fn builtin(&self, f: Builtin, args: Vec<Code>) -> Code {
        let name = match f {
            Builtin::Exp => "exp",
            Builtin::Ln => "log",
            Builtin::Sqrt => "sqrt",
            Builtin::Abs => "abs",
            Builtin::Sin => "sin",
            Builtin::Cos => "cos",
            Builtin::Floor => "floor",
            Builtin::Ceil => "ceil",
            Builtin::Log2 => "log2",
            Builtin::Exp2 => "exp2",
            Builtin::Max | Builtin::MaxUsize => "max",
            Builtin::Min | Builtin::MinUsize => "min",
            // WGSL's round() is ties-to-even.
            Builtin::RoundEven => "round",
            Builtin::Ln1p => "ds4_ln_1p",
            Builtin::Ilogb => "ds4_ilogb",
        };
        call(name, &args)
    }

    fn ident(&self, name: &str) -> String {
        escape(name, RESERVED)
    }

    fn element(&self, k: &Kernel, buf: &str, index: Code) -> Code {
        // Storage buffers cannot be offset, so the output index is shifted instead.
        if buf == k.out().0 {
            Code::atom(format!("{}[ds4_out_base + {}]", self.ident(buf), index.at(prec::ADD + 1)))
        } else {
            Code::atom(format!("{}[{}]", self.ident(buf), index.text))
        }
    }

    fn declare(&self, name: &str, ty: Ty, mutable: bool, init: &str) -> String {
        let kw = if mutable { "var" } else { "let" };
        format!("{kw} {name}: {} = {init};", self.ty(ty))
    }

    fn for_header(&self, var: &str, start: &str, end: &str) -> String {
        format!("for (var {var}: u32 = {start}; {var} < {end}; {var}++)")
    }

    fn prelude(&self, k: &Kernel) -> String {
        let mut s = format!("// {}: generated by ds4-codegen from kernel IR (target wgsl).\n\n", k.name);
        let used = k.builtins_used();
        if used.contains(&Builtin::Ln1p) {
            // ln(1 + x) with no log() near 1.
            s.push_str(&crate::render::ln_1p_shim("fn ds4_ln_1p(x: f32) -> f32", "log"));
        }
        if used.contains(&Builtin::Ilogb) {
            // floor(log2|x|), corrected where log2 rounds across an integer (as Real::ilogb).
            s.push_str(
                "fn ds4_ilogb(x: f32) -> f32 {\n    let a = abs(x);\n    var e = floor(log2(a));\n    \
                 if (exp2(e) > a) { e = e - 1.0f; } else if (exp2(e + 1.0f) <= a) { e = e + 1.0f; }\n    return e;\n}\n\n",
            );
        }
        s.push_str("struct Ds4Params {\n    ds4_items: u32,\n");
        for p in k.inputs() {
            if let ParamKind::Scalar { ty } = p.kind {
                s.push_str(&format!("    {}: {},\n", self.ident(&p.name), uniform_ty(ty)));
            }
        }
        s.push_str("}\n\n");
        let mut binding = 0;
        for p in &k.params {
            if let ParamKind::Buffer { elem, mutable } = p.kind {
                let access = if mutable { "read_write" } else { "read" };
                let t = if elem == Elem::F { "f32" } else { "i32" };
                s.push_str(&format!(
                    "@group(0) @binding({binding}) var<storage, {access}> {}: array<{t}>;\n",
                    self.ident(&p.name)
                ));
                binding += 1;
            }
        }
        s.push_str(&format!("@group(0) @binding({binding}) var<uniform> ds4_p: Ds4Params;\n\n"));
        s
    }

    fn helper_signature(&self, f: &Function) -> String {
        let params: Vec<String> = f.params.iter().map(|(n, t)| format!("{}: {}", self.ident(n), self.ty(*t))).collect();
        format!("fn {}({}) -> {}", self.ident(&f.name), params.join(", "), self.ty(f.ret))
    }

    fn kernel_open(&self, k: &Kernel, out_len: &str, _parallel: bool) -> String {
        let mut s = format!(
            "@compute @workgroup_size({WORKGROUP_SIZE})\nfn {}(@builtin(global_invocation_id) ds4_gid: vec3<u32>) {{\n    \
             let item: u32 = ds4_gid.x;\n    \
             if (item >= ds4_p.ds4_items) {{\n        return;\n    }}\n",
            k.name
        );
        // Scalars under the names the body uses.
        for p in k.inputs() {
            if let ParamKind::Scalar { ty } = p.kind {
                let name = self.ident(&p.name);
                let value = if ty == Ty::Bool { format!("ds4_p.{name} != 0u") } else { format!("ds4_p.{name}") };
                s.push_str(&format!("    let {name}: {} = {value};\n", self.ty(ty)));
            }
        }
        s.push_str(&format!("    let ds4_out_base: u32 = item * ({out_len});\n"));
        s
    }
}

/// The uniform field type of a scalar param.
fn uniform_ty(t: Ty) -> &'static str {
    match t {
        Ty::Usize | Ty::Bool => "u32",
        Ty::I32 => "i32",
        Ty::F => "f32",
    }
}
