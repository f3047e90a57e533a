//! The DS4 tokenizer: byte-level BPE as HF `tokenizers` runs it for DeepSeek-V4.
//!
//! Encoding a text:
//! 1. Added-token text (every token of type control 3 or user-defined 4, e.g.
//!    `<｜User｜>`, `<think>`, `｜DSML｜`) is cut out first, leftmost-longest, and becomes
//!    that token. [`Tokenizer::encode_ordinary`] skips this step and
//!    [`Tokenizer::encode_chat`] only recognises the seven chat markers, as antirez's
//!    ds4 engine does when it tokenizes a rendered prompt.
//! 2. The rest is split by the DeepSeek-V3 pre-tokenizer (see `pretok`).
//! 3. Each piece's UTF-8 bytes start as one token per byte, and the adjacent pair with the
//!    lowest merge rank is merged (the leftmost among equals) until no pair has a rank.
//!
//! Decoding maps every token back to its bytes (the inverse of the GPT-2 byte-to-char
//! table for normal tokens, the literal text for added tokens), so
//! `decode(encode(s)) == s` for every string.

mod pretok;
mod unicode_class;

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::gguf::{GgufError, GgufFile};

/// The DeepSeek-V3 pre-tokenizer's pieces of `text` (which is taken as plain text: no
/// added-token matching). They concatenate back to `text`. For inspection and tests;
/// `encode` does this internally.
pub fn pre_tokenize(text: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    pretok::pre_tokenize(text, &mut |p| pieces.push(p));
    pieces
}

/// GGUF `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
pub mod token_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    pub const BYTE: i32 = 6;
}

/// `tokenizer.ggml.pre` values that name the pre-tokenizer implemented here.
pub const SUPPORTED_PRE: [&str; 2] = ["joyai-llm", "deepseek-v3"];

/// The markers ds4's rendered-chat tokenizer recognises inside a prompt string.
pub const CHAT_MARKERS: [&str; 7] = [
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<think>",
    "</think>",
    "｜DSML｜",
];

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("tokenizer: {0}")]
    Invalid(String),
}

fn invalid(msg: impl Into<String>) -> TokenizerError {
    TokenizerError::Invalid(msg.into())
}

/// A cheap multiplicative hash (FxHash-like) for the merge table's `u64` pair keys and
/// the per-call piece cache; SipHash would cost more than the work it indexes.
#[derive(Default)]
struct FastHasher(u64);

impl FastHasher {
    #[inline]
    fn add(&mut self, v: u64) {
        // Fibonacci hashing; the rotation brings the well-mixed high bits down to
        // where hashbrown takes its bucket index from.
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

impl Hasher for FastHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0.rotate_left(26)
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().unwrap()));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut buf = [0u8; 8];
            buf[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(buf));
        }
    }
    #[inline]
    fn write_u8(&mut self, v: u8) {
        self.add(v as u64);
    }
    #[inline]
    fn write_usize(&mut self, v: usize) {
        self.add(v as u64);
    }
    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.add(v);
    }
}

type FastBuild = BuildHasherDefault<FastHasher>;

type PairMap = HashMap<u64, Merge, FastBuild>;

#[derive(Clone, Copy, Debug)]
struct Merge {
    rank: u32,
    merged: u32,
}

#[inline]
fn pair_key(left: u32, right: u32) -> u64 {
    ((left as u64) << 32) | right as u64
}

/// GPT-2's reversible byte <-> printable-char table: printable Latin-1 bytes stand for
/// themselves, the other 68 bytes map to U+0100.. in byte order.
fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..256u32 {
        let printable = (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        table[b as usize] = if printable {
            char::from_u32(b).unwrap()
        } else {
            next += 1;
            char::from_u32(next - 1).unwrap()
        };
    }
    table
}

/// Leftmost-longest matcher for a set of literal strings (the added tokens), as a byte
/// trie. Every string is valid UTF-8, so a match always starts and ends on character
/// boundaries of the text.
#[derive(Clone, Debug, Default)]
struct LiteralMatcher {
    /// `first[b]`: some string starts with byte `b`; lets the scan skip other bytes fast.
    first: Vec<bool>,
    nodes: Vec<TrieNode>,
}

#[derive(Clone, Debug, Default)]
struct TrieNode {
    /// Sorted by byte.
    children: Vec<(u8, u32)>,
    token: Option<u32>,
}

impl LiteralMatcher {
    fn new<'a>(items: impl IntoIterator<Item = (&'a str, u32)>) -> Self {
        let mut m = LiteralMatcher { first: vec![false; 256], nodes: vec![TrieNode::default()] };
        for (text, id) in items {
            let bytes = text.as_bytes();
            if bytes.is_empty() {
                continue;
            }
            m.first[bytes[0] as usize] = true;
            let mut node = 0usize;
            for &b in bytes {
                node = match m.nodes[node].children.binary_search_by_key(&b, |c| c.0) {
                    Ok(k) => m.nodes[node].children[k].1 as usize,
                    Err(k) => {
                        let new = m.nodes.len() as u32;
                        m.nodes.push(TrieNode::default());
                        m.nodes[node].children.insert(k, (b, new));
                        new as usize
                    }
                };
            }
            // Two tokens with the same text: the first id wins, as in a vocab map.
            m.nodes[node].token.get_or_insert(id);
        }
        m
    }

    /// The longest string starting at `pos`: (token, length).
    fn longest_at(&self, text: &[u8], pos: usize) -> Option<(u32, usize)> {
        let mut node = 0usize;
        let mut best = None;
        for (k, &b) in text[pos..].iter().enumerate() {
            match self.nodes[node].children.binary_search_by_key(&b, |c| c.0) {
                Ok(c) => node = self.nodes[node].children[c].1 as usize,
                Err(_) => break,
            }
            if let Some(t) = self.nodes[node].token {
                best = Some((t, k + 1));
            }
        }
        best
    }

    /// Splits `text` into plain spans and matched tokens, leftmost-longest.
    fn split<'a>(&self, text: &'a str, mut on_part: impl FnMut(Part<'a>)) {
        let b = text.as_bytes();
        let mut span = 0;
        let mut i = 0;
        while i < b.len() {
            if self.first[b[i] as usize] {
                if let Some((tok, len)) = self.longest_at(b, i) {
                    if span < i {
                        on_part(Part::Text(&text[span..i]));
                    }
                    on_part(Part::Token(tok));
                    i += len;
                    span = i;
                    continue;
                }
            }
            i += 1;
        }
        if span < b.len() {
            on_part(Part::Text(&text[span..]));
        }
    }
}

enum Part<'a> {
    Text(&'a str),
    Token(u32),
}

/// Which added-token texts `encode_with` turns into their tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Specials {
    /// All added tokens (HF `tokenizers` behaviour).
    All,
    /// Only [`CHAT_MARKERS`] (ds4's rendered-chat tokenizer).
    ChatMarkers,
    /// None: everything is plain text.
    None,
}

/// A loaded DS4 tokenizer. Immutable and `Sync`: share it across threads.
#[derive(Clone)]
pub struct Tokenizer {
    /// Token texts as stored in the vocabulary (byte-level chars for normal tokens).
    tokens: Vec<String>,
    token_types: Vec<i32>,
    /// The bytes each token decodes to, all tokens back to back; token `i` is
    /// `piece_bytes[piece_offsets[i]..piece_offsets[i + 1]]`.
    piece_bytes: Vec<u8>,
    piece_offsets: Vec<u32>,
    vocab: HashMap<String, u32>,
    merges: PairMap,
    /// The single-byte token of every byte value.
    byte_tokens: [u32; 256],
    added: LiteralMatcher,
    chat_markers: LiteralMatcher,
    bos: u32,
    eos: u32,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.tokens.len())
            .field("merges", &self.merges.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish()
    }
}

impl Tokenizer {
    /// Loads the tokenizer from GGUF metadata (`tokenizer.ggml.*`). Refuses files whose
    /// model is not byte-level BPE (`gpt2`) or whose pre-tokenizer is not DeepSeek's,
    /// since the split rules here are that pre-tokenizer's and no other. DeepSeek-V4
    /// GGUFs name it `joyai-llm` (llama.cpp's name for the same three-pass split),
    /// converters from the V3 tokenizer `deepseek-v3`; a file without the key is taken
    /// as DeepSeek's.
    pub fn from_gguf(g: &GgufFile) -> Result<Self, TokenizerError> {
        let model = g.get_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(invalid(format!("tokenizer.ggml.model is '{model}', expected 'gpt2' (byte-level BPE)")));
        }
        if let Some(pre) = g.meta("tokenizer.ggml.pre") {
            let pre = pre.as_str().unwrap_or("");
            if !SUPPORTED_PRE.contains(&pre) {
                return Err(invalid(format!(
                    "tokenizer.ggml.pre is '{pre}'; only DeepSeek's pre-tokenizer ({}) is implemented",
                    SUPPORTED_PRE.join(", ")
                )));
            }
        }
        let tokens: Vec<String> = g.get_str_array("tokenizer.ggml.tokens")?.into_iter().map(str::to_owned).collect();
        let merges: Vec<String> = g.get_str_array("tokenizer.ggml.merges")?.into_iter().map(str::to_owned).collect();
        let token_types = match g.meta("tokenizer.ggml.token_type") {
            Some(_) => g.get_i32_array("tokenizer.ggml.token_type")?,
            None => vec![token_type::NORMAL; tokens.len()],
        };
        let bos = g.get_u32("tokenizer.ggml.bos_token_id")?;
        let eos = g.get_u32("tokenizer.ggml.eos_token_id")?;
        Self::new(tokens, merges, token_types, bos, eos)
    }

    /// Builds the tokenizer from the vocabulary (`tokens[id]` in byte-level form), the
    /// merges in rank order (`"left right"`), the token types and the BOS/EOS ids.
    pub fn new(
        tokens: Vec<String>,
        merges: Vec<String>,
        token_types: Vec<i32>,
        bos: u32,
        eos: u32,
    ) -> Result<Self, TokenizerError> {
        let n = tokens.len();
        if n == 0 || n > u32::MAX as usize {
            return Err(invalid(format!("vocabulary size {n} is out of range")));
        }
        if token_types.len() != n {
            return Err(invalid(format!("{} token types for {n} tokens", token_types.len())));
        }
        for (what, id) in [("BOS", bos), ("EOS", eos)] {
            if id as usize >= n {
                return Err(invalid(format!("{what} id {id} is outside the vocabulary of {n}")));
            }
        }

        let mut vocab: HashMap<String, u32> = HashMap::with_capacity(n);
        for (id, t) in tokens.iter().enumerate() {
            // The first id of a duplicated text wins, like a vocabulary map built in order.
            vocab.entry(t.clone()).or_insert(id as u32);
        }

        let to_byte = byte_to_char_table();
        let mut char_to_byte: HashMap<char, u8> = HashMap::with_capacity(256);
        let mut byte_tokens = [0u32; 256];
        for (b, &c) in to_byte.iter().enumerate() {
            char_to_byte.insert(c, b as u8);
            byte_tokens[b] = *vocab
                .get(c.encode_utf8(&mut [0; 4]) as &str)
                .ok_or_else(|| invalid(format!("no token for byte {b:#04x} ('{c}')")))?;
        }

        let mut merge_map = PairMap::with_capacity_and_hasher(merges.len(), Default::default());
        for (rank, line) in merges.iter().enumerate() {
            let (l, r) = line
                .split_once(' ')
                .ok_or_else(|| invalid(format!("merge {rank} '{line}' is not two space-separated tokens")))?;
            let lookup = |t: &str| {
                vocab
                    .get(t)
                    .copied()
                    .ok_or_else(|| invalid(format!("merge {rank} '{line}': '{t}' is not in the vocabulary")))
            };
            let (left, right) = (lookup(l)?, lookup(r)?);
            let merged = lookup(&format!("{l}{r}"))?;
            // A repeated pair keeps its last rank, as HF's merge map does.
            merge_map.insert(pair_key(left, right), Merge { rank: rank as u32, merged });
        }

        // Bytes of each token. HF's byte-level decoder maps every char back to its byte
        // and falls back to the token's own UTF-8 when a char is not in the table, which
        // is what gives added tokens like `<｜User｜>` their literal text.
        let mut piece_bytes = Vec::new();
        let mut piece_offsets = Vec::with_capacity(n + 1);
        piece_offsets.push(0u32);
        for t in &tokens {
            let mapped: Option<Vec<u8>> = t.chars().map(|c| char_to_byte.get(&c).copied()).collect();
            match mapped {
                Some(bytes) => piece_bytes.extend_from_slice(&bytes),
                None => piece_bytes.extend_from_slice(t.as_bytes()),
            }
            let end = u32::try_from(piece_bytes.len()).map_err(|_| invalid("vocabulary text exceeds 4 GiB"))?;
            piece_offsets.push(end);
        }

        let is_added = |ty: i32| ty == token_type::CONTROL || ty == token_type::USER_DEFINED;
        let added = LiteralMatcher::new(
            tokens
                .iter()
                .zip(&token_types)
                .enumerate()
                .filter(|(_, (_, &ty))| is_added(ty))
                .map(|(id, (t, _))| (t.as_str(), id as u32)),
        );
        let mut markers = Vec::new();
        for m in CHAT_MARKERS {
            if let Some(&id) = vocab.get(m) {
                markers.push((m, id));
            }
        }
        let chat_markers = LiteralMatcher::new(markers);

        Ok(Tokenizer {
            tokens,
            token_types,
            piece_bytes,
            piece_offsets,
            vocab,
            merges: merge_map,
            byte_tokens,
            added,
            chat_markers,
            bos,
            eos,
        })
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }
    pub fn bos(&self) -> u32 {
        self.bos
    }
    pub fn eos(&self) -> u32 {
        self.eos
    }
    pub fn n_merges(&self) -> usize {
        self.merges.len()
    }

    /// True for added tokens (GGUF type control or user-defined): the BOS/EOS and chat
    /// markers, `<think>`, `｜DSML｜`, placeholders. Their text is protocol, not content.
    pub fn is_special(&self, id: u32) -> bool {
        matches!(self.token_type(id), Some(token_type::CONTROL | token_type::USER_DEFINED))
    }

    /// The GGUF token type of `id` (see [`token_type`]); `None` outside the vocabulary.
    pub fn token_type(&self, id: u32) -> Option<i32> {
        self.token_types.get(id as usize).copied()
    }

    /// The vocabulary entry of `id` as stored (byte-level form, e.g. `Ġworld`).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of a vocabulary entry given in its stored form (`Ġworld`, `<think>`).
    pub fn token_to_id(&self, text: &str) -> Option<u32> {
        self.vocab.get(text).copied()
    }

    /// The bytes token `id` stands for; empty outside the vocabulary. A piece can be
    /// part of a UTF-8 character: use [`StreamDecoder`] to turn a stream into text.
    pub fn token_to_piece(&self, id: u32) -> &[u8] {
        let i = id as usize;
        if i >= self.tokens.len() {
            return &[];
        }
        &self.piece_bytes[self.piece_offsets[i] as usize..self.piece_offsets[i + 1] as usize]
    }

    /// The bytes of a token sequence (ids outside the vocabulary contribute nothing).
    pub fn decode_bytes(&self, ids: &[u32]) -> Vec<u8> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            out.extend_from_slice(self.token_to_piece(id));
        }
        out
    }

    /// The text of a token sequence; byte sequences that are not valid UTF-8 (a cut
    /// multi-byte character) become U+FFFD, as in HF's decoder.
    pub fn decode(&self, ids: &[u32]) -> String {
        match String::from_utf8(self.decode_bytes(ids)) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }

    /// Encodes `text` as HF `tokenizers` does for DeepSeek-V4 with
    /// `add_special_tokens=false`: no BOS is added, and the text of any added token is
    /// that token.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.encode_with(text, Specials::All)
    }

    /// Encodes `text` treating all of it as content: `<｜User｜>` in the input becomes
    /// ordinary text tokens. For user-supplied text that must not inject markers.
    pub fn encode_ordinary(&self, text: &str) -> Vec<u32> {
        self.encode_with(text, Specials::None)
    }

    /// Encodes a rendered chat prompt the way ds4 does: only the seven
    /// [`CHAT_MARKERS`] are recognised, everything else is content.
    pub fn encode_chat(&self, text: &str) -> Vec<u32> {
        self.encode_with(text, Specials::ChatMarkers)
    }

    fn encode_with(&self, text: &str, specials: Specials) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 4);
        let mut bpe = BpeScratch::default();
        match specials {
            Specials::None => self.encode_plain(text, &mut bpe, &mut out),
            Specials::All | Specials::ChatMarkers => {
                let matcher = if specials == Specials::All { &self.added } else { &self.chat_markers };
                matcher.split(text, |part| match part {
                    Part::Text(s) => self.encode_plain(s, &mut bpe, &mut out),
                    Part::Token(t) => out.push(t),
                });
            }
        }
        out
    }

    /// Pre-tokenizes and BPE-encodes text that holds no added tokens.
    fn encode_plain<'a>(&self, text: &'a str, bpe: &mut BpeScratch<'a>, out: &mut Vec<u32>) {
        pretok::pre_tokenize(text, &mut |piece| {
            // Words repeat: a piece seen before in this call copies the tokens it got
            // then (from `out`) instead of running BPE again.
            if piece.len() < 2 || piece.len() > MAX_CACHED_PIECE {
                return self.bpe_piece(piece.as_bytes(), bpe, out);
            }
            if let Some(&(start, len)) = bpe.cache.get(piece) {
                out.extend_from_within(start as usize..(start + len) as usize);
                return;
            }
            let start = out.len();
            self.bpe_piece(piece.as_bytes(), bpe, out);
            if bpe.cache.len() < MAX_CACHE_ENTRIES {
                bpe.cache.insert(piece, (start as u32, (out.len() - start) as u32));
            }
        });
    }

    /// Encodes one pre-tokenizer piece and appends its tokens to `out`.
    fn bpe_piece(&self, piece: &[u8], scratch: &mut BpeScratch, out: &mut Vec<u32>) {
        match piece.len() {
            0 => {}
            1 => out.push(self.byte_tokens[piece[0] as usize]),
            // Short pieces (nearly all of them): repeated scans over a small array beat
            // any heap bookkeeping.
            2..=SHORT_PIECE => self.bpe_short(piece, scratch, out),
            _ => self.bpe_long(piece, scratch, out),
        }
    }

    #[inline]
    fn merge_of(&self, left: u32, right: u32) -> Option<Merge> {
        self.merges.get(&pair_key(left, right)).copied()
    }

    /// BPE by repeated linear scan: `syms` holds the current tokens and `ranks[k]` the
    /// rank of merging `syms[k]` with `syms[k + 1]` (u32::MAX if they do not merge).
    /// Each step merges the lowest rank, leftmost on ties, and recomputes only the two
    /// pairs that changed.
    fn bpe_short(&self, piece: &[u8], scratch: &mut BpeScratch, out: &mut Vec<u32>) {
        let syms = &mut scratch.syms;
        let ranks = &mut scratch.ranks;
        let merged = &mut scratch.merged;
        syms.clear();
        syms.extend(piece.iter().map(|&b| self.byte_tokens[b as usize]));
        ranks.clear();
        merged.clear();
        for k in 0..syms.len() - 1 {
            let m = self.merge_of(syms[k], syms[k + 1]);
            ranks.push(m.map_or(u32::MAX, |m| m.rank));
            merged.push(m.map_or(0, |m| m.merged));
        }
        loop {
            let mut best = u32::MAX;
            let mut at = usize::MAX;
            for (k, &r) in ranks.iter().enumerate() {
                if r < best {
                    best = r;
                    at = k;
                }
            }
            if at == usize::MAX {
                break;
            }
            syms[at] = merged[at];
            syms.remove(at + 1);
            ranks.remove(at);
            merged.remove(at);
            // The pairs (at-1, at) and (at, at+1) now involve the new token.
            if at > 0 {
                let m = self.merge_of(syms[at - 1], syms[at]);
                ranks[at - 1] = m.map_or(u32::MAX, |m| m.rank);
                merged[at - 1] = m.map_or(0, |m| m.merged);
            }
            if at + 1 < syms.len() {
                let m = self.merge_of(syms[at], syms[at + 1]);
                ranks[at] = m.map_or(u32::MAX, |m| m.rank);
                merged[at] = m.map_or(0, |m| m.merged);
            }
        }
        out.extend_from_slice(syms);
    }

    /// BPE for long pieces (a run of thousands of letters is a single piece): symbols in
    /// a doubly linked list and candidate merges in a min-heap ordered by (rank,
    /// position), so each merge costs O(log n). A popped candidate is stale, and is
    /// skipped, when either of its symbols has since been merged away or changed.
    /// The order of merges is the same as `bpe_short`'s.
    fn bpe_long(&self, piece: &[u8], scratch: &mut BpeScratch, out: &mut Vec<u32>) {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;

        const NONE: u32 = u32::MAX;
        let n = piece.len();
        let syms = &mut scratch.syms;
        syms.clear();
        syms.extend(piece.iter().map(|&b| self.byte_tokens[b as usize]));
        // prev/next links; a merged-away symbol gets `alive = false`.
        let mut prev: Vec<u32> = (0..n as u32).map(|k| if k == 0 { NONE } else { k - 1 }).collect();
        let mut next: Vec<u32> = (0..n as u32).map(|k| if k + 1 == n as u32 { NONE } else { k + 1 }).collect();
        let mut alive = vec![true; n];
        // Heap entries: (rank, left position, left token, right token). Positions are
        // original byte indices, which keep the left-to-right order of live symbols.
        let mut heap: BinaryHeap<Reverse<(u32, u32, u32, u32)>> = BinaryHeap::with_capacity(n);
        for k in 0..n - 1 {
            if let Some(m) = self.merge_of(syms[k], syms[k + 1]) {
                heap.push(Reverse((m.rank, k as u32, syms[k], syms[k + 1])));
            }
        }
        while let Some(Reverse((rank, pos, left, right))) = heap.pop() {
            let p = pos as usize;
            let q = next[p];
            if !alive[p] || q == NONE || syms[p] != left || syms[q as usize] != right {
                continue;
            }
            let m = self.merge_of(left, right).expect("pair in heap has a merge");
            debug_assert_eq!(m.rank, rank);
            let q = q as usize;
            syms[p] = m.merged;
            alive[q] = false;
            next[p] = next[q];
            if next[q] != NONE {
                prev[next[q] as usize] = p as u32;
            }
            if prev[p] != NONE {
                let l = prev[p] as usize;
                if let Some(m) = self.merge_of(syms[l], syms[p]) {
                    heap.push(Reverse((m.rank, l as u32, syms[l], syms[p])));
                }
            }
            if next[p] != NONE {
                let r = next[p] as usize;
                if let Some(m) = self.merge_of(syms[p], syms[r]) {
                    heap.push(Reverse((m.rank, p as u32, syms[p], syms[r])));
                }
            }
        }
        let mut k = 0u32;
        while k != NONE {
            out.push(syms[k as usize]);
            k = next[k as usize];
        }
    }
}

/// Pieces up to this many bytes use the linear-scan BPE.
const SHORT_PIECE: usize = 64;

/// Pieces longer than this are not cached (long pieces rarely repeat).
const MAX_CACHED_PIECE: usize = 48;
/// Bounds the cache's memory on huge inputs with endless distinct words.
const MAX_CACHE_ENTRIES: usize = 1 << 16;

/// Buffers reused across the pieces of one `encode` call, and the call's piece cache:
/// piece text -> (start, length) of its tokens in the output.
#[derive(Default)]
struct BpeScratch<'a> {
    syms: Vec<u32>,
    ranks: Vec<u32>,
    merged: Vec<u32>,
    cache: HashMap<&'a str, (u32, u32), FastBuild>,
}

/// Turns a stream of tokens into text without splitting UTF-8 characters: bytes of an
/// unfinished character are held until the token that completes them arrives.
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one token and returns the text it completes (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        self.pending.extend_from_slice(tok.token_to_piece(id));
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            // An unfinished character at the end: keep it for the next token.
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            // A byte sequence that can never become valid: emit it (lossily) now.
            Err(_) => self.pending.len(),
        };
        let rest = self.pending.split_off(valid);
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending = rest;
        text
    }

    /// Returns whatever is still held (an incomplete character, lossily).
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy vocabulary: the 256 byte tokens plus merges "a a", "aa a", "b c".
    fn toy() -> Tokenizer {
        let table = byte_to_char_table();
        let mut tokens: Vec<String> = table.iter().map(|c| c.to_string()).collect();
        tokens.extend(["aa", "aaa", "bc", "<s>"].map(String::from));
        let mut types = vec![token_type::NORMAL; tokens.len()];
        *types.last_mut().unwrap() = token_type::CONTROL;
        let merges = ["a a", "aa a", "b c"].map(String::from).to_vec();
        Tokenizer::new(tokens, merges, types, 259, 259).unwrap()
    }

    #[test]
    fn shareable_across_threads() {
        fn check<T: Send + Sync>() {}
        check::<Tokenizer>();
    }

    #[test]
    fn byte_table_is_gpt2s() {
        let t = byte_to_char_table();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[0xAD], '\u{143}');
        let distinct: std::collections::HashSet<char> = t.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
    }

    #[test]
    fn short_and_long_bpe_agree() {
        let tok = toy();
        let mut rng = 0x1234_5678u64;
        for len in [2usize, 3, 5, 9, 40, 65, 200, 1000] {
            for _ in 0..20 {
                let piece: Vec<u8> = (0..len)
                    .map(|_| {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        [b'a', b'b', b'c'][(rng % 3) as usize]
                    })
                    .collect();
                let (mut s, mut l) = (Vec::new(), Vec::new());
                let mut scratch = BpeScratch::default();
                tok.bpe_short(&piece, &mut scratch, &mut s);
                tok.bpe_long(&piece, &mut scratch, &mut l);
                assert_eq!(s, l, "{}", String::from_utf8_lossy(&piece));
                assert_eq!(tok.decode_bytes(&s), piece);
            }
        }
        let aaa = tok.token_to_id("aaa").unwrap();
        let aa = tok.token_to_id("aa").unwrap();
        // "aaaaa": the rank-0 "a a" merges go first, leftmost first, giving [aa][aa][a];
        // then rank-1 "aa a" gives [aa][aaa].
        assert_eq!(tok.encode("aaaaa"), vec![aa, aaa]);
    }

    #[test]
    fn specials_and_stream() {
        let tok = toy();
        assert_eq!(tok.encode("<s>"), vec![259]);
        assert_ne!(tok.encode_ordinary("<s>"), vec![259]);
        assert_eq!(tok.decode(&tok.encode("x<s>y")), "x<s>y");
        let mut sd = StreamDecoder::new();
        let ids = tok.encode("é!");
        let mut text = String::new();
        for id in ids {
            text += &sd.push(&tok, id);
        }
        text += &sd.finish();
        assert_eq!(text, "é!");
    }

    #[test]
    fn bad_input_is_refused() {
        let table = byte_to_char_table();
        let tokens: Vec<String> = table.iter().map(|c| c.to_string()).collect();
        let n = tokens.len();
        let e = Tokenizer::new(tokens.clone(), vec!["a b".into()], vec![1; n], 0, 0).unwrap_err();
        assert!(e.to_string().contains("'ab' is not in the vocabulary"), "{e}");
        let e = Tokenizer::new(tokens.clone(), vec!["ab".into()], vec![1; n], 0, 0).unwrap_err();
        assert!(e.to_string().contains("not two space-separated"), "{e}");
        let e = Tokenizer::new(tokens.clone(), vec![], vec![1; n - 1], 0, 0).unwrap_err();
        assert!(e.to_string().contains("token types"), "{e}");
        let e = Tokenizer::new(tokens[1..].to_vec(), vec![], vec![1; n - 1], 0, 0).unwrap_err();
        assert!(e.to_string().contains("no token for byte"), "{e}");
        let e = Tokenizer::new(tokens, vec![], vec![1; n], 0, 999).unwrap_err();
        assert!(e.to_string().contains("EOS id 999"), "{e}");
    }
}
