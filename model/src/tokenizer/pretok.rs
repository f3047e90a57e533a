//! The DeepSeek-V3/V4 pre-tokenizer: splits text into the pieces that BPE then encodes
//! one at a time.
//!
//! The reference (HF `tokenizers`, `tokenizer.json` of DeepSeek-V4, llama.cpp's
//! `deepseek-v3` pre-type) is a sequence of three regex splits, each keeping both the
//! matches and the text between them as pieces ("Isolated"), each applied to the
//! pieces of the previous one:
//!
//! 1. `\p{N}{1,3}`: runs of numeric characters, chopped into groups of three.
//! 2. `[一-龥぀-ゟ゠-ヿ]+`: runs of CJK ideographs (U+4E00..=U+9FA5) and kana
//!    (U+3040..=U+30FF).
//! 3. The GPT-style split, with alternatives tried in this order:
//!    ```text
//!    A1  [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+
//!    A2  [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
//!    A3   ?[\p{P}\p{S}]+[\r\n]*
//!    A4  \s*[\r\n]+
//!    A5  \s+(?!\S)
//!    A6  \s+
//!    ```
//!
//! Instead of a regex engine this is a hand-written scanner that reproduces what the
//! backtracking engine does for this exact pattern (each alternative's effect is worked
//! out in `scan_words`). Two consequences of the "sequence of splits" structure matter:
//! a number or CJK run is never merged with its neighbours, and the look-ahead of A5
//! ends at the end of the current piece, not of the whole text.
//!
//! Character classes come from `unicode_class.rs`, generated from Unicode 16.0 data,
//! the version the reference's regex engine uses.

use std::sync::OnceLock;

use super::unicode_class::CLASS_RUNS;

/// The classes the pattern distinguishes. Unicode White_Space (`\s`) is disjoint from
/// the general categories L/M/N/P/S, so one value per character is enough.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub(crate) enum CharClass {
    Other = 0,
    Letter = 1,
    Mark = 2,
    Number = 3,
    Punct = 4,
    Symbol = 5,
    Space = 6,
}

impl CharClass {
    #[inline(always)]
    fn from_u8(v: u8) -> CharClass {
        match v {
            1 => CharClass::Letter,
            2 => CharClass::Mark,
            3 => CharClass::Number,
            4 => CharClass::Punct,
            5 => CharClass::Symbol,
            6 => CharClass::Space,
            _ => CharClass::Other,
        }
    }
    #[inline(always)]
    fn letter_or_mark(self) -> bool {
        matches!(self, CharClass::Letter | CharClass::Mark)
    }
    #[inline(always)]
    fn punct_or_symbol(self) -> bool {
        matches!(self, CharClass::Punct | CharClass::Symbol)
    }
}

/// A two-level lookup table over all code points: `blocks[cp >> 8]` names a 256-entry
/// page in `pages`. Identical pages are stored once (most of the astral planes share
/// a handful), which keeps the table around 100 KiB while making a lookup two loads.
struct ClassTable {
    blocks: Vec<u16>,
    pages: Vec<u8>,
}

fn class_table() -> &'static ClassTable {
    static TABLE: OnceLock<ClassTable> = OnceLock::new();
    TABLE.get_or_init(|| {
        // Expand the run list into one class per code point, then deduplicate pages.
        let mut flat = vec![0u8; 0x110000];
        for (i, &entry) in CLASS_RUNS.iter().enumerate() {
            let start = (entry >> 3) as usize;
            let end = CLASS_RUNS.get(i + 1).map_or(0x110000, |&next| (next >> 3) as usize);
            flat[start..end].fill((entry & 7) as u8);
        }
        let mut blocks = Vec::with_capacity(0x1100);
        let mut pages: Vec<u8> = Vec::new();
        let mut seen: std::collections::HashMap<&[u8], u16> = std::collections::HashMap::new();
        for page in flat.chunks(256) {
            let idx = *seen.entry(page).or_insert_with(|| {
                let idx = (pages.len() / 256) as u16;
                pages.extend_from_slice(page);
                idx
            });
            blocks.push(idx);
        }
        ClassTable { blocks, pages }
    })
}

/// Class of every ASCII character, so that the common case needs no table walk.
const ASCII_CLASS: [CharClass; 128] = {
    let mut t = [CharClass::Other; 128];
    let mut c = 0;
    while c < 128 {
        let b = c as u8;
        t[c] = if b == b' ' || (b >= 0x09 && b <= 0x0d) {
            CharClass::Space
        } else if b.is_ascii_alphabetic() {
            CharClass::Letter
        } else if b.is_ascii_digit() {
            CharClass::Number
        } else if b < 0x20 || b == 0x7f {
            CharClass::Other
        } else if matches!(b, b'$' | b'+' | b'<' | b'=' | b'>' | b'^' | b'`' | b'|' | b'~') {
            // The ASCII characters of Unicode categories Sc, Sm and Sk.
            CharClass::Symbol
        } else {
            CharClass::Punct
        };
        c += 1;
    }
    t
};

impl ClassTable {
    #[inline(always)]
    fn class_of(&self, cp: u32) -> CharClass {
        if cp < 128 {
            return ASCII_CLASS[cp as usize];
        }
        let page = self.blocks[(cp >> 8) as usize] as usize;
        CharClass::from_u8(self.pages[page * 256 + (cp & 0xff) as usize])
    }

    /// The character at byte `i` of valid UTF-8: code point, length, class.
    #[inline(always)]
    fn char_at(&self, b: &[u8], i: usize) -> (u32, usize, CharClass) {
        let c0 = b[i];
        if c0 < 0x80 {
            return (c0 as u32, 1, ASCII_CLASS[c0 as usize]);
        }
        let (cp, len) = decode_at(b, i);
        (cp, len, self.class_of(cp))
    }
}

#[cfg(test)]
fn class_of(cp: u32) -> CharClass {
    class_table().class_of(cp)
}

#[inline]
fn is_cjk(cp: u32) -> bool {
    (0x4E00..=0x9FA5).contains(&cp) || (0x3040..=0x30FF).contains(&cp)
}

/// Decodes the character starting at byte `i` of valid UTF-8; returns it and its length.
#[inline(always)]
fn decode_at(b: &[u8], i: usize) -> (u32, usize) {
    let c0 = b[i] as u32;
    if c0 < 0x80 {
        (c0, 1)
    } else if c0 < 0xE0 {
        (((c0 & 0x1F) << 6) | (b[i + 1] as u32 & 0x3F), 2)
    } else if c0 < 0xF0 {
        (((c0 & 0x0F) << 12) | ((b[i + 1] as u32 & 0x3F) << 6) | (b[i + 2] as u32 & 0x3F), 3)
    } else {
        let cp = ((c0 & 0x07) << 18)
            | ((b[i + 1] as u32 & 0x3F) << 12)
            | ((b[i + 2] as u32 & 0x3F) << 6)
            | (b[i + 3] as u32 & 0x3F);
        (cp, 4)
    }
}

/// Splits `text` (which contains no added-token text) into pre-tokenizer pieces, in
/// order, calling `emit` with each. The pieces concatenate back to `text`.
pub(crate) fn pre_tokenize<'a>(text: &'a str, emit: &mut impl FnMut(&'a str)) {
    let t = class_table();
    let b = text.as_bytes();
    let n = b.len();
    // Steps 1 and 2 together: a run of numbers is emitted in groups of three, a CJK run
    // or a run of anything else is passed on to step 3. No character is both numeric
    // and in the CJK ranges, so the two splits commute.
    let mut i = 0;
    while i < n {
        let (cp, len, class) = t.char_at(b, i);
        if class == CharClass::Number {
            let start = i;
            let mut count = 0;
            let mut j = i;
            while j < n && count < 3 {
                let (_, len2, class2) = t.char_at(b, j);
                if class2 != CharClass::Number {
                    break;
                }
                j += len2;
                count += 1;
            }
            emit(&text[start..j]);
            i = j;
            continue;
        }
        let cjk = is_cjk(cp);
        let start = i;
        let mut j = i + len;
        while j < n {
            let (cp2, len2, class2) = t.char_at(b, j);
            if is_cjk(cp2) != cjk || class2 == CharClass::Number {
                break;
            }
            j += len2;
        }
        scan_words(t, &text[start..j], emit);
        i = j;
    }
}

/// Step 3: the GPT-style split of one piece.
fn scan_words<'a>(t: &ClassTable, s: &'a str, emit: &mut impl FnMut(&'a str)) {
    let b = s.as_bytes();
    let n = b.len();
    // End of the run of characters whose class satisfies `pred`, starting at `i`.
    let run_end = |mut i: usize, pred: fn(CharClass) -> bool| -> usize {
        while i < n {
            let (_, len, class) = t.char_at(b, i);
            if !pred(class) {
                break;
            }
            i += len;
        }
        i
    };
    let class_at = |i: usize| -> Option<CharClass> {
        if i < n {
            Some(t.char_at(b, i).2)
        } else {
            None
        }
    };

    let mut gap = 0; // start of the not-yet-emitted text between matches
    let mut i = 0;
    while i < n {
        let (cp, len, class) = t.char_at(b, i);
        let next = i + len;
        let end: Option<usize> = 'alt: {
            // A1: one ASCII punctuation character then ASCII letters ("'s", ".Foo").
            if cp < 128 && (cp as u8).is_ascii_punctuation() && next < n && b[next].is_ascii_alphabetic() {
                let mut j = next;
                while j < n && b[j].is_ascii_alphabetic() {
                    j += 1;
                }
                break 'alt Some(j);
            }
            // A2: letters/marks, optionally preceded by one character that is not
            // CR, LF, a letter, punctuation or a symbol (a space, a tab, a digit, a
            // control...). A mark can be both the prefix and part of the run; either
            // way the match ends where the letter/mark run starting at `i` ends.
            if class.letter_or_mark() {
                break 'alt Some(run_end(next, CharClass::letter_or_mark));
            }
            if cp != 0x0D
                && cp != 0x0A
                && !matches!(class, CharClass::Punct | CharClass::Symbol)
                && class_at(next).is_some_and(CharClass::letter_or_mark)
            {
                break 'alt Some(run_end(next, CharClass::letter_or_mark));
            }
            // A3: an optional ASCII space, punctuation/symbols, then any CR/LF.
            let ps_start = if class.punct_or_symbol() {
                Some(i)
            } else if cp == 0x20 && class_at(next).is_some_and(CharClass::punct_or_symbol) {
                Some(next)
            } else {
                None
            };
            if let Some(p) = ps_start {
                let mut j = run_end(p, CharClass::punct_or_symbol);
                while j < n && (b[j] == b'\r' || b[j] == b'\n') {
                    j += 1;
                }
                break 'alt Some(j);
            }
            if class == CharClass::Space {
                // Measure the whitespace run: its end, the start of its last character
                // and the end of its last CR/LF.
                let mut j = i;
                let mut last_start = i;
                let mut chars = 0usize;
                let mut after_newline = None;
                while j < n {
                    let (c2, l2, class2) = t.char_at(b, j);
                    if class2 != CharClass::Space {
                        break;
                    }
                    if c2 == 0x0D || c2 == 0x0A {
                        after_newline = Some(j + l2);
                    }
                    last_start = j;
                    chars += 1;
                    j += l2;
                }
                // A4: greedy `\s*` backs off to the last CR/LF, `[\r\n]+` takes it.
                if let Some(e) = after_newline {
                    break 'alt Some(e);
                }
                // A5: the whole run if it reaches the end of the piece; otherwise all
                // but its last character, which then prefixes the next word (A2/A3).
                if j == n {
                    break 'alt Some(j);
                }
                if chars >= 2 {
                    break 'alt Some(last_start);
                }
                // A6: a single whitespace character before a non-space.
                break 'alt Some(j);
            }
            None
        };
        match end {
            Some(e) => {
                if gap < i {
                    emit(&s[gap..i]);
                }
                emit(&s[i..e]);
                gap = e;
                i = e;
            }
            // No alternative matches here: the character joins the gap.
            None => i = next,
        }
    }
    if gap < n {
        emit(&s[gap..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(s: &str) -> Vec<&str> {
        let mut v = Vec::new();
        pre_tokenize(s, &mut |p| v.push(p));
        v
    }

    #[test]
    fn splits_like_the_reference() {
        assert_eq!(pieces("Hello  world 1234"), ["Hello", " ", " world", " ", "123", "4"]);
        assert_eq!(pieces("a  b   c"), ["a", " ", " b", "  ", " c"]);
        assert_eq!(pieces("line1\nline2\r\n"), ["line", "1", "\n", "line", "2", "\r\n"]);
        assert_eq!(pieces("it's"), ["it", "'s"]);
        assert_eq!(pieces("x  \n y"), ["x", "  \n", " y"]);
        assert_eq!(pieces("trail  "), ["trail", "  "]);
        assert_eq!(pieces("你好，世界"), ["你好", "，", "世界"]);
        assert_eq!(pieces("a!!\n\nb"), ["a", "!!\n\n", "b"]);
        assert_eq!(pieces("\u{200b}x"), ["\u{200b}x"]);
        assert_eq!(pieces("\u{200b}"), ["\u{200b}"]);
    }

    #[test]
    fn classes() {
        assert_eq!(class_of('a' as u32), CharClass::Letter);
        assert_eq!(class_of('\u{3000}' as u32), CharClass::Space);
        assert_eq!(class_of('\u{0301}' as u32), CharClass::Mark);
        assert_eq!(class_of('½' as u32), CharClass::Number);
        assert_eq!(class_of('€' as u32), CharClass::Symbol);
        assert_eq!(class_of('«' as u32), CharClass::Punct);
        assert_eq!(class_of(0x105C0), CharClass::Letter); // Todhri, new in Unicode 16.0
        assert_eq!(class_of(0x10FFFF), CharClass::Other);
        for c in 0u32..128 {
            let t = class_table();
            let page = t.blocks[0] as usize;
            assert_eq!(ASCII_CLASS[c as usize] as u8, t.pages[page * 256 + c as usize], "{c:#x}");
        }
    }
}
