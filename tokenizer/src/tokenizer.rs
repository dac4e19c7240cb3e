//! [`Tokenizer`]: text to token ids and back, in the shape tiktoken's users know.
//!
//! # Why this module exists
//!
//! It is the one place that puts an encoding together (vocabulary, pre-tokenizer
//! pattern, special tokens) and runs it: on the CPU the pre-tokenizer cuts the
//! text into pieces ([`Splitter::pieces`], which walks a text of any length
//! without allocating) and [`bpe`](crate::bpe) merges each piece; on a device the
//! whole encode runs in [`DeviceEncoder`], one batch of documents per call (the
//! segments between special tokens, or `encode_batch`'s texts). The output and
//! the merge loop's scratch are allocated once per call, never per piece.
//! Built-in encodings parse their embedded vocabulary once per process and share
//! it, and the device encoder of an encoding, between tokenizers.
//!
//! A device failure never changes ids: `encode_ordinary`, `encode_ordinary_bytes`,
//! `encode_with_special_tokens` and `encode_batch` encode on the CPU instead,
//! `encode` reports it.

use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use rayon::prelude::*;
use vyre_cuda::backend::{AnyBackend, CudaBackend};

use crate::bpe::{encode_piece, Scratch};
use crate::device::pipeline::Admission;
use crate::device::{BatchIds, ChunkLimits, DeviceEncoder, Geometry};
use crate::error::{ErrorKind, TokenizerError};
use crate::pretokenize::pattern::{Pattern, Splitter};
use crate::special::{Finder, SpecialToken, SpecialTokens};
use crate::vocab::Vocabulary;

/// Where a tokenizer runs.
///
/// On the GPU the whole encode of every encoding runs on the device
/// ([`DeviceEncoder`]: the pre-tokenizer's split and the BPE merges; text up,
/// ids down).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The CPU (the default): no device is touched.
    #[default]
    Cpu,
    /// The GPU where there is a CUDA device, for texts (and batches) of at
    /// least [`AUTO_GPU_MIN_BYTES`] (below that the dispatches cost more than
    /// the CPU encode); the CPU otherwise.
    Auto,
    /// The GPU, or an `Err` at [`Tokenizer::with_backend`] saying why not.
    Gpu,
}

impl Backend {
    /// Lower-case name, as on the example's command line.
    pub const fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Auto => "auto",
            Backend::Gpu => "gpu",
        }
    }
}

impl FromStr for Backend {
    type Err = TokenizerError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        [Backend::Auto, Backend::Cpu, Backend::Gpu]
            .into_iter()
            .find(|backend| backend.name() == text)
            .ok_or_else(|| {
                TokenizerError::new(
                    ErrorKind::Backend,
                    format!("Fix: unknown backend {text:?}; use auto, cpu or gpu"),
                )
            })
    }
}

/// Under [`Backend::Auto`], texts (and batches) shorter than this (64 KiB) are
/// encoded on the CPU.
pub const AUTO_GPU_MIN_BYTES: usize = 64 << 10;

/// [`Tokenizer::encode_batch`] runs on one thread below this many bytes in all.
pub const BATCH_PARALLEL_MIN_BYTES: usize = 64 << 10;

/// tiktoken's four OpenAI encodings, built in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Encoding {
    /// GPT-3 (`r50k_base`): GPT-2's pattern, 50,256 ranks, `<|endoftext|>` 50256.
    R50kBase,
    /// Codex (`p50k_base`): GPT-2's pattern, ranks to 50280 (none at 50256),
    /// `<|endoftext|>` 50256.
    P50kBase,
    /// GPT-3.5 and GPT-4 (`cl100k_base`): 100,256 ranks, `<|endoftext|>` 100257,
    /// `<|fim_prefix|>` 100258, `<|fim_middle|>` 100259, `<|fim_suffix|>` 100260,
    /// `<|endofprompt|>` 100276.
    Cl100kBase,
    /// GPT-4o (`o200k_base`): 199,998 ranks, `<|endoftext|>` 199999,
    /// `<|endofprompt|>` 200018.
    O200kBase,
}

impl Encoding {
    /// Every built-in encoding.
    pub const ALL: [Encoding; 4] = [
        Encoding::R50kBase,
        Encoding::P50kBase,
        Encoding::Cl100kBase,
        Encoding::O200kBase,
    ];

    /// tiktoken's name, e.g. `cl100k_base`.
    pub const fn name(self) -> &'static str {
        match self {
            Encoding::R50kBase => "r50k_base",
            Encoding::P50kBase => "p50k_base",
            Encoding::Cl100kBase => "cl100k_base",
            Encoding::O200kBase => "o200k_base",
        }
    }

    /// The pre-tokenizer pattern.
    pub const fn pattern(self) -> Pattern {
        match self {
            Encoding::R50kBase | Encoding::P50kBase => Pattern::Gpt2,
            Encoding::Cl100kBase => Pattern::Cl100k,
            Encoding::O200kBase => Pattern::O200k,
        }
    }

    /// The special tokens, as tiktoken defines them.
    pub const fn special_tokens(self) -> &'static [(&'static str, u32)] {
        match self {
            Encoding::R50kBase | Encoding::P50kBase => &[("<|endoftext|>", 50256)],
            Encoding::Cl100kBase => &[
                ("<|endoftext|>", 100257),
                ("<|fim_prefix|>", 100258),
                ("<|fim_middle|>", 100259),
                ("<|fim_suffix|>", 100260),
                ("<|endofprompt|>", 100276),
            ],
            Encoding::O200kBase => &[("<|endoftext|>", 199999), ("<|endofprompt|>", 200018)],
        }
    }

    /// The embedded `.tiktoken` vocabulary (vendored from the tiktoken-rs crate,
    /// MIT: `tokenizer/vocab/`).
    pub fn tiktoken_bytes(self) -> &'static [u8] {
        match self {
            Encoding::R50kBase => include_bytes!("../vocab/r50k_base.tiktoken"),
            Encoding::P50kBase => include_bytes!("../vocab/p50k_base.tiktoken"),
            Encoding::Cl100kBase => include_bytes!("../vocab/cl100k_base.tiktoken"),
            Encoding::O200kBase => include_bytes!("../vocab/o200k_base.tiktoken"),
        }
    }
}

impl FromStr for Encoding {
    type Err = TokenizerError;

    /// `r50k`, `p50k`, `cl100k`, `o200k`, with or without `_base`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Encoding::ALL
            .into_iter()
            .find(|encoding| {
                encoding.name() == text || encoding.name().strip_suffix("_base") == Some(text)
            })
            .ok_or_else(|| {
                TokenizerError::new(
                    ErrorKind::Backend,
                    format!("Fix: unknown encoding {text:?}; use r50k, p50k, cl100k or o200k"),
                )
            })
    }
}

/// Everything an encoding is; shared by the tokenizers made from it.
#[derive(Debug)]
struct EncodingData {
    name: String,
    splitter: Splitter,
    vocabulary: Vocabulary,
    special: SpecialTokens,
    /// The encoder on CUDA device 0, made on the first `with_backend` that
    /// may use it and shared by every tokenizer of this encoding.
    device: OnceLock<Result<Arc<DeviceEncoder>, TokenizerError>>,
}

impl EncodingData {
    /// The shared encoder on CUDA device 0, or why there is none.
    fn shared_device(&self) -> Result<Arc<DeviceEncoder>, TokenizerError> {
        self.device
            .get_or_init(|| {
                let (gpu, admission) = shared_cuda()?;
                DeviceEncoder::for_vocabulary(
                    AnyBackend::Cuda(gpu),
                    &self.vocabulary,
                    self.splitter.pattern(),
                    Geometry::default(),
                    ChunkLimits::default(),
                    admission,
                )
                .map(Arc::new)
            })
            .clone()
    }
}

/// A tiktoken-exact tokenizer: one encoding on one backend. Cheap to clone (the
/// encoding is shared); `Send + Sync`, so one tokenizer serves many threads.
///
/// ```
/// use vyre_tokenizer::Tokenizer;
/// let tokenizer = Tokenizer::r50k_base()?;
/// let ids = tokenizer.encode_ordinary("Hello, world!");
/// assert_eq!(ids, [15496, 11, 995, 0]);
/// assert_eq!(tokenizer.decode(&ids)?, "Hello, world!");
/// // Special tokens are text unless allowed, and an error where not allowed.
/// assert!(tokenizer.encode("<|endoftext|>", &[]).is_err());
/// assert_eq!(tokenizer.encode("<|endoftext|>", &["<|endoftext|>"])?, [50256]);
/// # Ok::<(), vyre_tokenizer::TokenizerError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Tokenizer {
    encoding: Arc<EncodingData>,
    backend: Backend,
    /// Present when `backend` may run on a device.
    device: Option<Arc<DeviceEncoder>>,
}

impl Tokenizer {
    /// A tokenizer of `vocabulary` with the pre-tokenizer `pattern` and
    /// `special_tokens` (text, id), on the CPU.
    pub fn new(
        vocabulary: Vocabulary,
        pattern: Pattern,
        special_tokens: &[(&str, u32)],
    ) -> Result<Self, TokenizerError> {
        Self::with_name(
            pattern.name().to_owned(),
            vocabulary,
            pattern,
            special_tokens,
        )
    }

    fn with_name(
        name: String,
        vocabulary: Vocabulary,
        pattern: Pattern,
        special_tokens: &[(&str, u32)],
    ) -> Result<Self, TokenizerError> {
        let special = SpecialTokens::new(special_tokens, &vocabulary)?;
        // The split's setup (its Unicode table) fails here, if ever, not inside
        // an encode.
        let splitter = Splitter::new(pattern)?;
        Ok(Tokenizer {
            encoding: Arc::new(EncodingData {
                name,
                splitter,
                vocabulary,
                special,
                device: OnceLock::new(),
            }),
            backend: Backend::Cpu,
            device: None,
        })
    }

    /// A tokenizer from a `.tiktoken` file (see [`Vocabulary::from_tiktoken_file`]).
    pub fn from_tiktoken_file(
        path: impl AsRef<Path>,
        pattern: Pattern,
        special_tokens: &[(&str, u32)],
    ) -> Result<Self, TokenizerError> {
        Self::new(
            Vocabulary::from_tiktoken_file(path)?,
            pattern,
            special_tokens,
        )
    }

    /// A tokenizer from the contents of a `.tiktoken` file.
    pub fn from_tiktoken_bytes(
        bytes: &[u8],
        pattern: Pattern,
        special_tokens: &[(&str, u32)],
    ) -> Result<Self, TokenizerError> {
        Self::new(
            Vocabulary::from_tiktoken_bytes(bytes)?,
            pattern,
            special_tokens,
        )
    }

    /// A built-in encoding, on the CPU. Its vocabulary is parsed once per process.
    pub fn for_encoding(encoding: Encoding) -> Result<Self, TokenizerError> {
        static BUILT: [OnceLock<Result<Tokenizer, TokenizerError>>; 4] = [
            OnceLock::new(),
            OnceLock::new(),
            OnceLock::new(),
            OnceLock::new(),
        ];
        let index = Encoding::ALL
            .iter()
            .position(|&e| e == encoding)
            .unwrap_or(0);
        BUILT[index]
            .get_or_init(|| {
                let vocabulary = Vocabulary::from_tiktoken_bytes(encoding.tiktoken_bytes())?;
                Self::with_name(
                    encoding.name().to_owned(),
                    vocabulary,
                    encoding.pattern(),
                    encoding.special_tokens(),
                )
            })
            .clone()
    }

    /// `r50k_base` (GPT-3).
    pub fn r50k_base() -> Result<Self, TokenizerError> {
        Self::for_encoding(Encoding::R50kBase)
    }

    /// `p50k_base` (Codex).
    pub fn p50k_base() -> Result<Self, TokenizerError> {
        Self::for_encoding(Encoding::P50kBase)
    }

    /// `cl100k_base` (GPT-3.5, GPT-4).
    pub fn cl100k_base() -> Result<Self, TokenizerError> {
        Self::for_encoding(Encoding::Cl100kBase)
    }

    /// `o200k_base` (GPT-4o).
    pub fn o200k_base() -> Result<Self, TokenizerError> {
        Self::for_encoding(Encoding::O200kBase)
    }

    /// The same tokenizer on `backend`. [`Backend::Gpu`] is an `Err` without a
    /// CUDA device (or when the device cannot hold the encoder);
    /// [`Backend::Auto`] then runs on the CPU.
    pub fn with_backend(mut self, backend: Backend) -> Result<Self, TokenizerError> {
        self.backend = backend;
        self.device = None;
        if backend == Backend::Cpu {
            return Ok(self);
        }
        match self.encoding.shared_device() {
            Ok(device) => self.device = Some(device),
            Err(error) if backend == Backend::Gpu => return Err(error),
            Err(_) => {}
        }
        Ok(self)
    }

    /// The same tokenizer running every encode on `backend` through a
    /// [`DeviceEncoder`] of its own (on the reference interpreter, the device
    /// programs run on the CPU: what the CPU tests use). [`Tokenizer::backend`]
    /// is then [`Backend::Gpu`].
    pub fn with_device(mut self, backend: AnyBackend) -> Result<Self, TokenizerError> {
        let encoder = DeviceEncoder::new(backend, &self)?;
        self.backend = Backend::Gpu;
        self.device = Some(Arc::new(encoder));
        Ok(self)
    }

    /// The backend asked for ([`Tokenizer::with_backend`]).
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Where a text (or batch) of `text_len` bytes is encoded: [`Backend::Cpu`]
    /// or [`Backend::Gpu`]. Texts of 4 GiB or more (the device's offsets are 32
    /// bits) are encoded on the CPU on every backend.
    pub fn runs_on(&self, text_len: usize) -> Backend {
        match (&self.device, self.backend) {
            (Some(_), _) if text_len > u32::MAX as usize => Backend::Cpu,
            (Some(_), Backend::Gpu) => Backend::Gpu,
            (Some(_), Backend::Auto) if text_len >= AUTO_GPU_MIN_BYTES => Backend::Gpu,
            _ => Backend::Cpu,
        }
    }

    /// The CUDA device's name, when the device may run.
    pub fn device_name(&self) -> Option<&str> {
        self.device.as_deref().and_then(DeviceEncoder::device_name)
    }

    /// The device encoder, when the device may run.
    pub fn device_encoder(&self) -> Option<&DeviceEncoder> {
        self.device.as_deref()
    }

    /// The encoding's name (`cl100k_base`, or the pattern's name for a tokenizer
    /// made from a file).
    pub fn name(&self) -> &str {
        &self.encoding.name
    }

    /// The pre-tokenizer pattern.
    pub fn pattern(&self) -> Pattern {
        self.encoding.splitter.pattern()
    }

    /// The vocabulary.
    pub fn vocabulary(&self) -> &Vocabulary {
        &self.encoding.vocabulary
    }

    /// The special tokens.
    pub fn special_tokens(&self) -> &[SpecialToken] {
        self.encoding.special.all()
    }

    /// The token ids of `text`; special-token text is ordinary text here.
    pub fn encode_ordinary(&self, text: &str) -> Vec<u32> {
        self.encode_ordinary_bytes(text.as_bytes())
    }

    /// The token ids of any bytes. Bytes that are not UTF-8 follow the
    /// pre-tokenizer's rule (each is a character of its own, U+FFFD, for the
    /// split; [`crate::pretokenize`]), and merge as the bytes they are, so
    /// [`Tokenizer::decode_bytes`] gives back exactly `text`; the device follows
    /// the same rule. On valid UTF-8 the ids are [`Tokenizer::encode_ordinary`]'s.
    /// Should the device fail, the text is encoded on the CPU (the ids are the
    /// same); [`Tokenizer::encode`] reports such a failure instead.
    pub fn encode_ordinary_bytes(&self, text: &[u8]) -> Vec<u32> {
        if let Some(device) = self.device_for(text.len()) {
            if let Ok(mut ids) = device.encode_batch_bytes(&[text]) {
                return ids.pop().unwrap_or_default();
            }
        }
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        self.encode_on_cpu(text, &mut out, &mut Scratch::default());
        out
    }

    /// The device encoder when a text of `text_len` bytes runs on it.
    fn device_for(&self, text_len: usize) -> Option<&DeviceEncoder> {
        match self.runs_on(text_len) {
            Backend::Gpu => self.device.as_deref(),
            Backend::Cpu | Backend::Auto => None,
        }
    }

    /// The token ids of `text`, with the special tokens in `allowed_special`
    /// (their texts) encoded as their ids. Like tiktoken's default
    /// (`disallowed_special="all"`), any other special token of this encoding
    /// found in the text is an `Err` naming it; an allowed name that is not a
    /// special token of this encoding is an `Err` too.
    pub fn encode(&self, text: &str, allowed_special: &[&str]) -> Result<Vec<u32>, TokenizerError> {
        let special = &self.encoding.special;
        let mut allowed: Vec<&SpecialToken> = Vec::with_capacity(allowed_special.len());
        for &name in allowed_special {
            let token = special.by_text(name).ok_or_else(|| {
                TokenizerError::new(
                    ErrorKind::DisallowedSpecialToken,
                    format!(
                        "Fix: {name:?} is not a special token of {}; allow only {}",
                        self.encoding.name,
                        self.special_token_list()
                    ),
                )
            })?;
            allowed.push(token);
        }
        let disallowed = special
            .all()
            .iter()
            .filter(|token| !allowed.contains(token));
        if let Some((offset, token)) = Finder::new(text, disallowed).find_from(0) {
            return Err(TokenizerError::new(
                ErrorKind::DisallowedSpecialToken,
                format!(
                    "Fix: the text holds the special token {:?} at byte {offset}, which this call does not \
                     allow; pass it in allowed_special to encode it as id {}, or use encode_ordinary to \
                     encode it as plain text",
                    token.text, token.id
                ),
            ));
        }
        self.encode_around(text, allowed.iter().copied(), self.device_for(text.len()))
    }

    /// [`Tokenizer::encode`] with every special token allowed.
    pub fn encode_with_special_tokens(&self, text: &str) -> Vec<u32> {
        let tokens = self.encoding.special.all().iter();
        if let Some(device) = self.device_for(text.len()) {
            if let Ok(ids) = self.encode_around(text, tokens.clone(), Some(device)) {
                return ids;
            }
        }
        // Without a device the encode cannot fail.
        self.encode_around(text, tokens, None).unwrap_or_default()
    }

    /// The ids of `text` with the special tokens of `tokens` as their ids and
    /// the segments between them encoded as one batch, on `device` or on the
    /// CPU. Only the device can fail.
    fn encode_around<'t>(
        &self,
        text: &'t str,
        tokens: impl Iterator<Item = &'t SpecialToken>,
        device: Option<&DeviceEncoder>,
    ) -> Result<Vec<u32>, TokenizerError>
    where
        Self: 't,
    {
        let mut segments: Vec<&[u8]> = Vec::new();
        let mut specials: Vec<u32> = Vec::new();
        let mut finder = Finder::new(text, tokens);
        let mut at = 0;
        while let Some((offset, token)) = finder.find_from(at) {
            segments.push(&text.as_bytes()[at..offset]);
            specials.push(token.id);
            at = offset + token.text.len();
        }
        segments.push(&text.as_bytes()[at..]);
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        match device {
            Some(device) => {
                let encoded = device.encode_batch_bytes(&segments)?;
                for (index, ids) in encoded.iter().enumerate() {
                    out.extend_from_slice(ids);
                    if let Some(&id) = specials.get(index) {
                        out.push(id);
                    }
                }
            }
            None => {
                let mut scratch = Scratch::default();
                for (index, segment) in segments.iter().enumerate() {
                    self.encode_on_cpu(segment, &mut out, &mut scratch);
                    if let Some(&id) = specials.get(index) {
                        out.push(id);
                    }
                }
            }
        }
        Ok(out)
    }

    /// [`Tokenizer::encode_ordinary`] of every text, on all of the machine's
    /// threads (one when the texts hold under [`BATCH_PARALLEL_MIN_BYTES`] in
    /// all): `result[i]` is the ids of `texts[i]`.
    pub fn encode_batch(&self, texts: &[&str]) -> Vec<Vec<u32>> {
        let total: usize = texts.iter().map(|text| text.len()).sum();
        if let Some(device) = self.device_for(total) {
            if let Ok(ids) = device.encode_batch(texts) {
                return ids;
            }
        }
        self.encode_batch_on_cpu(texts, total)
    }

    /// [`Tokenizer::encode_batch`] into `ids`, one result in which each
    /// document's ids are a slice ([`BatchIds::get`]), its memory reused by
    /// the next batch encoded into it. On the GPU the device's copy engine
    /// writes the ids straight into it
    /// ([`DeviceEncoder::encode_batch_ids`](crate::device::DeviceEncoder::encode_batch_ids)),
    /// so the host copies no id; on the CPU (and where the device fails, as
    /// [`Tokenizer::encode_batch`] does) it takes the CPU's ids.
    pub fn encode_batch_ids(&self, texts: &[&str], ids: &mut BatchIds) {
        let total: usize = texts.iter().map(|text| text.len()).sum();
        if let Some(device) = self.device_for(total) {
            let bytes: Vec<&[u8]> = texts.iter().map(|text| text.as_bytes()).collect();
            if device.encode_batch_ids(&bytes, ids).is_ok() {
                return;
            }
        }
        ids.fill_from(self.encode_batch_on_cpu(texts, total));
    }

    /// [`Tokenizer::encode_batch`] on the CPU (`total`: the texts' bytes): on
    /// the batch pool's workers (`workers::cpu_batch_pool`, started once per
    /// process) from [`BATCH_PARALLEL_MIN_BYTES`] up, the texts in order.
    fn encode_batch_on_cpu(&self, texts: &[&str], total: usize) -> Vec<Vec<u32>> {
        let encode = |text: &&str| self.encode_ordinary_on_cpu(text.as_bytes());
        let pool = (texts.len() > 1 && total >= BATCH_PARALLEL_MIN_BYTES)
            .then(crate::workers::cpu_batch_pool)
            .flatten()
            .filter(|pool| pool.current_num_threads() > 1);
        match pool {
            Some(pool) => pool.install(|| texts.par_iter().map(encode).collect()),
            None => texts.iter().map(encode).collect(),
        }
    }

    /// The bytes of `ids` (ranks and special tokens), concatenated. An id that is
    /// neither is an `Err` naming it and its position.
    pub fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>, TokenizerError> {
        let vocabulary = &self.encoding.vocabulary;
        let mut out = Vec::with_capacity(ids.len() * 4);
        for (position, &id) in ids.iter().enumerate() {
            if let Some(bytes) = vocabulary.token(id) {
                out.extend_from_slice(bytes);
            } else if let Some(token) = self.encoding.special.by_id(id) {
                out.extend_from_slice(token.text.as_bytes());
            } else {
                return Err(TokenizerError::new(
                    ErrorKind::UnknownToken,
                    format!(
                        "Fix: id {id} at position {position} is no token of {} (ranks below {}, special tokens {}); \
                         decode only ids this encoding produced",
                        self.encoding.name,
                        vocabulary.rank_bound(),
                        self.special_token_list()
                    ),
                ));
            }
        }
        Ok(out)
    }

    /// The text of `ids`; an `Err` if an id is unknown or the bytes are not UTF-8
    /// (ids cut in the middle of a character: use [`Tokenizer::decode_bytes`]).
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        String::from_utf8(self.decode_bytes(ids)?).map_err(|error| {
            TokenizerError::new(
                ErrorKind::InvalidUtf8,
                format!(
                    "Fix: the ids decode to bytes that are not UTF-8 (from byte {}); use decode_bytes for \
                     ids that may cut a character",
                    error.utf8_error().valid_up_to()
                ),
            )
            .with_source(error.utf8_error())
        })
    }

    fn special_token_list(&self) -> String {
        let names: Vec<String> = self
            .encoding
            .special
            .all()
            .iter()
            .map(|token| format!("{:?} ({})", token.text, token.id))
            .collect();
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    }

    /// The ids of `text` on the CPU.
    fn encode_ordinary_on_cpu(&self, text: &[u8]) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        self.encode_on_cpu(text, &mut out, &mut Scratch::default());
        out
    }

    /// The CPU split and the merges, for any bytes of any length.
    fn encode_on_cpu(&self, text: &[u8], out: &mut Vec<u32>, scratch: &mut Scratch) {
        let encoding = &*self.encoding;
        for piece in encoding.splitter.pieces(text) {
            encode_piece(&encoding.vocabulary, piece, out, scratch);
        }
    }
}

/// CUDA device 0, acquired once for every tokenizer of the process, and the
/// admission its encoders share: the encoders of all encodings share its
/// compiled kernels (their programs are the same) and its limit of pending
/// dispatches.
fn shared_cuda() -> Result<(CudaBackend, Arc<Admission>), TokenizerError> {
    static CUDA: OnceLock<Result<(CudaBackend, Arc<Admission>), TokenizerError>> = OnceLock::new();
    CUDA.get_or_init(|| {
        let gpu = CudaBackend::acquire().map_err(|error| {
            TokenizerError::new(
                ErrorKind::Backend,
                format!(
                    "Fix: Backend::Gpu needs a CUDA device, and none answered ({error}); \
                     use Backend::Auto or Backend::Cpu on this machine"
                ),
            )
            .with_source(error)
        })?;
        Ok((gpu, Arc::default()))
    })
    .clone()
}
