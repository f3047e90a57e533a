#!/usr/bin/env python3
"""A generated CUDA kernel's registers, spills and SASS instruction counts, offline (no GPU).

    python3 scripts/sass/sass.py FILE.cu [--sm 90] [--list]

FILE.cu is a kernel source as `ds4 gen --all --target cuda-sm90 --out DIR` writes it. It is
compiled as the runtime compiles it (runtime/src/cuda/compile.rs: NVRTC, compute_<sm>,
--fmad=false), assembled by ptxas (-v: registers, spills, shared memory) and disassembled
by cuobjdump/nvdisasm; the SASS instructions are counted by opcode (--list prints them).

Why: the device budget is minutes a session, and a kernel variant's instruction count
and register use (what bounds the experts' integer mat-vecs: docs/cuda-backend.md) can be
compared here first. The tools are NVIDIA's pip wheels (nvidia-cuda-nvrtc-cu12,
nvidia-cuda-nvcc-cu12 for ptxas, nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm), downloaded
once into $DS4_SASS_TOOLS (default ~/.cache/ds4-sass) with network. The toolkit version
differs from the device's (CUDA 13 there), so counts are close, not equal, to what runs.
"""
import collections, ctypes, glob, os, re, subprocess, sys, zipfile

TOOLS = os.environ.get("DS4_SASS_TOOLS", os.path.expanduser("~/.cache/ds4-sass"))
WHEELS = ["nvidia-cuda-nvrtc-cu12", "nvidia-cuda-nvcc-cu12", "nvidia-cuda-cuobjdump", "nvidia-cuda-nvdisasm"]


def tool(pattern):
    hits = [p for p in glob.glob(os.path.join(TOOLS, "x", "**", pattern), recursive=True) if os.path.isfile(p)]
    return hits[0] if hits else None


def install():
    """The four wheels, unpacked under TOOLS/x, their programs made executable."""
    if tool("libnvrtc.so.12") and tool("ptxas") and tool("cuobjdump") and tool("nvdisasm"):
        return
    os.makedirs(TOOLS, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", TOOLS] + WHEELS, check=True)
    for whl in glob.glob(os.path.join(TOOLS, "*.whl")):
        zipfile.ZipFile(whl).extractall(os.path.join(TOOLS, "x"))
    for name in ["ptxas", "cuobjdump", "nvdisasm"]:
        os.chmod(tool(name), 0o755)


def ptx_of(source, sm):
    """NVRTC's PTX of `source`, with the runtime's options."""
    nvrtc = ctypes.CDLL(tool("libnvrtc.so.12"))
    prog = ctypes.c_void_p()
    if nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kernel.cu", 0, None, None) != 0:
        sys.exit("nvrtcCreateProgram failed")
    opts = [f"--gpu-architecture=compute_{sm}".encode(), b"--fmad=false"]
    rc = nvrtc.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    n = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        sys.exit(log.value.decode())
    nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(n))
    ptx = ctypes.create_string_buffer(n.value)
    nvrtc.nvrtcGetPTX(prog, ptx)
    return ptx.value.decode()


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit(__doc__)
    sm = args[args.index("--sm") + 1] if "--sm" in args else "90"
    install()
    work = os.path.join(TOOLS, "work")
    os.makedirs(work, exist_ok=True)
    ptx, cubin = os.path.join(work, "k.ptx"), os.path.join(work, "k.cubin")
    with open(ptx, "w") as f:
        f.write(ptx_of(open(args[0]).read(), sm))
    r = subprocess.run([tool("ptxas"), f"-arch=sm_{sm}", "-v", ptx, "-o", cubin], capture_output=True, text=True)
    for line in r.stderr.splitlines():
        if re.search(r"registers|spill|error", line):
            print(line.strip())
    env = dict(os.environ, PATH=os.path.dirname(tool("nvdisasm")) + os.pathsep + os.environ.get("PATH", ""))
    sass = subprocess.run([tool("cuobjdump"), "-sass", cubin], capture_output=True, text=True, env=env).stdout
    ops = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if m:
            ops[m.group(1)] += 1
            if "--list" in args:
                print(line.strip())
    print(f"SASS instructions: {sum(ops.values())}")
    print(", ".join(f"{k} {v}" for k, v in ops.most_common(30)))


if __name__ == "__main__":
    main()
