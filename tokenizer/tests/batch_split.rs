//! CPU tests of the batch split (`pretokenize::batch`): the state machines the
//! cl100k and o200k device programs are generated from, held to `fancy-regex`;
//! and every program on the reference interpreter (through `AnyBackend`),
//! eager and as a graph, held to the CPU splitter run on each document alone,
//! on the corpus, random and damaged strings, documents whose ends cut runs and
//! characters, long runs and empty documents. Reference inputs stay a few KiB;
//! small workgroups make them cross many workgroups, so the look-backs walk
//! back over many blocks and several rounds.

#[path = "support/batches.rs"]
mod batches;
mod oracle;
mod split_corpus;
#[path = "../../tests/support/without.rs"]
mod without;

use batches::{boundaries_matter, boundary_cases, expected_starts, pack, shortened};
use oracle::Oracle;
use vyre_cuda::backend::AnyBackend;
use vyre_cuda::ir::{AtomicOp, Node, Program};
use vyre_cuda::reference::{ReferenceOptions, WorkgroupOrder};
use vyre_tokenizer::device::BulkSplit;
use vyre_tokenizer::pretokenize::batch::rules::{self, Condition, Rule, StateMachine, StateWindow};
use vyre_tokenizer::pretokenize::batch::runner::BatchSplitter;
use vyre_tokenizer::pretokenize::batch::word_table::WordTable;
use vyre_tokenizer::pretokenize::batch::{check_batch, SplitBuffer, SplitPrograms};
use vyre_tokenizer::pretokenize::batch::{word_table, word_table_start};
use vyre_tokenizer::pretokenize::pattern::Pattern;
use vyre_tokenizer::pretokenize::text::{generate, Shape, SplitMix64};
use vyre_tokenizer::pretokenize::unicode::Kind;
use vyre_tokenizer::pretokenize::Geometry;
use without::without;

fn shown(text: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(text))
}

/// 16 threads of 2 bytes: 32-byte blocks, so a few KiB cross a hundred
/// workgroups and a look-back walks several rounds of 16 blocks.
fn small() -> Geometry {
    Geometry {
        workgroup_size: 16,
        bytes_per_thread: 2,
        compact_workgroups: 1,
    }
}

fn splitter(backend: &AnyBackend, pattern: Pattern, geometry: Geometry) -> BatchSplitter {
    let programs = SplitPrograms::build(pattern, geometry).expect("geometry");
    BatchSplitter::new(backend, programs).expect("splitter")
}

/// Runs `documents` through `splitter` eagerly (and as a graph with `graph`);
/// each must give each document's own split.
fn check_runs(splitter: &mut BatchSplitter, documents: &[Vec<u8>], what: &str, graph: bool) {
    let pattern = splitter.programs().pattern();
    let (text, ends) = pack(documents);
    let expected = expected_starts(pattern, documents);
    let eager = splitter.split(&text, &ends).expect("eager split");
    assert_eq!(
        eager,
        expected,
        "{pattern:?} eager, {what}: {}",
        shown(&text)
    );
    if graph {
        let replayed = splitter.split_graph(&text, &ends).expect("graph split");
        assert_eq!(
            replayed,
            expected,
            "{pattern:?} graph, {what}: {}",
            shown(&text)
        );
    }
}

/// [`check_runs`] eagerly and as a graph.
fn check(splitter: &mut BatchSplitter, documents: &[Vec<u8>], what: &str) {
    check_runs(splitter, documents, what, true);
}

/// Locks out a state machine that differs from the patterns: the machines the
/// cl100k and o200k programs are generated from, run on the CPU over
/// `per_position`'s windows, give `fancy-regex`'s piece starts on the whole
/// corpus, the UTF-8 boundary texts, the three shapes and 20,000 random
/// strings (a third of them damaged) per pattern.
#[test]
fn state_machines_equal_oracle() {
    let mut texts = split_corpus::corpus(oracle::corpus());
    texts.extend(oracle::utf8_boundary_texts());
    for shape in Shape::ALL {
        texts.push(generate(shape, 20_000, 1));
    }
    let mut random = SplitMix64::new(0x0057_47E5);
    for _ in 0..20_000 {
        texts.push(split_corpus::random_bytes(&mut random, 16));
    }
    for pattern in [Pattern::Cl100k, Pattern::O200k] {
        let oracle = Oracle::for_pattern(pattern);
        for text in &texts {
            assert_eq!(
                rules::piece_starts(pattern, text).expect("state machine"),
                oracle.starts(text),
                "{pattern:?}: {}",
                shown(text)
            );
        }
    }
    assert!(rules::piece_starts(Pattern::Gpt2, b"x")
        .unwrap_err()
        .message()
        .starts_with("Fix:"));
}

/// `machine` with state `state`'s continuation rules replaced.
fn with_continues(
    machine: &StateMachine,
    state: usize,
    rules: &'static [Rule],
) -> &'static StateMachine {
    let mut continues: Vec<&'static [Rule]> = machine.continues.to_vec();
    continues[state] = rules;
    Box::leak(Box::new(StateMachine {
        continues: Box::leak(continues.into_boxed_slice()),
        ..*machine
    }))
}

fn machine_starts(machine: &StateMachine, text: &[u8]) -> Vec<u32> {
    rules::machine_piece_starts(machine, text).expect("state machine")
}

/// Negative control for the merged states: the `White` state needs the
/// character before's `break_ahead` to tell `\s*[\r\n]+` from `\s+(?!\S)`,
/// and o200k's `Upper` state needs `upper_to_end`; a machine that drops
/// either (always the first rule, or never backtracking) disagrees with the
/// oracle on corpus texts, so the comparison above would catch it.
#[test]
fn negative_control_merged_states_need_their_facts() {
    const ALWAYS_BREAKS: &[Rule] = &[Rule {
        when: Condition::Kind(
            rules::Field::Here,
            vyre_tokenizer::pretokenize::unicode::KindSet::WHITE_SPACE,
        ),
        next: 6,
    }];
    const NEVER_BACKTRACKS: &[Rule] = &[Rule {
        when: Condition::Kind(
            rules::Field::Here,
            vyre_tokenizer::pretokenize::unicode::KindSet::WORD,
        ),
        next: 2,
    }];
    let texts = split_corpus::corpus(oracle::corpus());
    for (pattern, broken) in [
        (
            Pattern::Cl100k,
            with_continues(&rules::CL100K, 6, ALWAYS_BREAKS),
        ),
        (
            Pattern::O200k,
            with_continues(&rules::O200K, 2, NEVER_BACKTRACKS),
        ),
    ] {
        let oracle = Oracle::for_pattern(pattern);
        let caught = texts
            .iter()
            .filter(|text| machine_starts(broken, text) != oracle.starts(text))
            .count();
        assert!(caught >= 10, "{pattern:?}: only {caught} texts catch it");
        let exact = StateMachine::of(pattern).expect("machine");
        assert!(texts
            .iter()
            .all(|text| machine_starts(exact, text) == oracle.starts(text)));
    }
}

/// Every character's window in `texts` as the state machine sees it, with
/// whether it starts its text.
fn text_windows(texts: &[Vec<u8>]) -> Vec<(StateWindow, bool)> {
    texts
        .iter()
        .flat_map(|text| rules::state_windows(text).expect("windows"))
        .map(|(offset, window)| (window, offset == 0))
        .collect()
}

/// How many of `windows` `table` answers
/// differently from `machine`'s rules.
fn table_disagreements(
    table: &WordTable,
    machine: &StateMachine,
    windows: &[(StateWindow, bool)],
) -> usize {
    windows
        .iter()
        .filter(|(window, document_start)| {
            let codes = window.kinds.map(|kind| kind as u32);
            let facts = [
                window.break_ahead,
                window.break_ahead_before,
                window.upper_to_end,
            ];
            table.lookup(codes, facts, *document_start)
                != machine.character_word(window, *document_start)
        })
        .count()
}

/// Locks out a word table that answers differently from the rules it was built
/// from (a class that merges kinds some condition tells apart, fact bits in
/// another order, strides that overlap entries, a wrong document-start
/// override): for every character of the corpus and of random strings, and
/// 200,000 random windows of kinds and facts, the table's lookup (the `phases`
/// program's additions and loads, on the CPU) equals
/// `StateMachine::character_word`. Negative control: the table of a machine
/// with one rule changed disagrees with the exact rules on some of them.
#[test]
fn word_tables_answer_as_the_rules_do() {
    let mut texts = split_corpus::corpus(oracle::corpus());
    let mut random = SplitMix64::new(0x7AB1);
    for _ in 0..200 {
        texts.push(split_corpus::random_bytes(&mut random, 24));
    }
    let mut windows = text_windows(&texts);
    for _ in 0..200_000 {
        let mut kind = || Kind::ALL[random.below(Kind::ALL.len() as u32) as usize];
        let kinds = [kind(), kind(), kind(), kind(), kind()];
        let mut bit = || random.below(2) == 1;
        let window = StateWindow {
            kinds,
            break_ahead: bit(),
            break_ahead_before: bit(),
            upper_to_end: bit(),
        };
        windows.push((window, bit()));
    }
    let first_word = word_table_start().expect("kind table");
    for pattern in [Pattern::Cl100k, Pattern::O200k] {
        let machine = StateMachine::of(pattern).expect("machine");
        let table = word_table(pattern)
            .expect("table")
            .expect("a machine's table");
        assert_eq!(
            table_disagreements(table, machine, &windows),
            0,
            "{pattern:?}"
        );
        const NEVER_CONTINUES: &[Rule] = &[];
        let broken = with_continues(machine, 1, NEVER_CONTINUES);
        let broken_table = WordTable::build(broken, first_word);
        assert!(
            table_disagreements(&broken_table, machine, &windows) > 0,
            "{pattern:?}: the negative control agrees"
        );
    }
}

/// Locks out maps that compose in the wrong order or lose a state: composing
/// is applying one map then the other, the identity and constant maps behave
/// as named.
#[test]
fn transition_maps_compose_as_functions() {
    let mut random = SplitMix64::new(0x3A95);
    let map = |random: &mut SplitMix64| {
        (0..8u32).fold(0u32, |map, state| {
            map | (random.below(8) << (rules::SLOT_BITS * state))
        })
    };
    for _ in 0..2_000 {
        let (first, then) = (map(&mut random), map(&mut random));
        let both = rules::compose(first, then);
        for state in 0..8u8 {
            assert_eq!(
                rules::apply(both, state),
                rules::apply(then, rules::apply(first, state))
            );
            assert_eq!(rules::apply(rules::IDENTITY_MAP, state), state);
            assert_eq!(rules::apply(rules::constant_map(5), state), 5);
        }
        assert_eq!(rules::compose(rules::IDENTITY_MAP, first), first);
        assert_eq!(rules::compose(first, rules::IDENTITY_MAP), first);
    }
}

/// Locks out any disagreement between the device programs and each document's
/// own split on the hand-written corpus: every corpus text (GPT-2's and the
/// newer patterns', UTF-8 boundary texts included) as a document of batches of
/// about 40, empty documents among them, for every pattern, eager and as a
/// graph, on 32-byte blocks.
#[test]
fn reference_batches_equal_each_document_split_on_corpus() {
    let backend = AnyBackend::reference();
    let mut texts = split_corpus::corpus(oracle::corpus());
    texts.extend(oracle::utf8_boundary_texts());
    for pattern in Pattern::ALL {
        let mut splitter = splitter(&backend, pattern, small());
        for (index, batch) in batches::batches(texts.clone(), 40, 7).iter().enumerate() {
            check(&mut splitter, batch, &format!("corpus batch {index}"));
        }
    }
}

/// Locks out disagreements on inputs nobody thought of: 1,500 random strings
/// per pattern (one in three damaged into invalid UTF-8) as documents of
/// batches of about 60, eager and as a graph.
#[test]
fn reference_batches_equal_each_document_split_on_random_strings() {
    let backend = AnyBackend::reference();
    for (pattern, seed) in [
        (Pattern::Gpt2, 0xB47C_0001u64),
        (Pattern::Cl100k, 0xB47C_0002),
        (Pattern::O200k, 0xB47C_0003),
    ] {
        let mut random = SplitMix64::new(seed);
        let texts: Vec<Vec<u8>> = (0..1_500)
            .map(|_| split_corpus::random_bytes(&mut random, 16))
            .collect();
        let mut splitter = splitter(&backend, pattern, small());
        for (index, batch) in batches::batches(texts, 60, seed).iter().enumerate() {
            check(&mut splitter, batch, &format!("random batch {index}"));
        }
    }
}

/// Locks out a document boundary that leaks: documents that end inside a
/// white-space run, a digit run (the next document's groups of three start
/// afresh), a letter run of each case, a contraction, a punctuation tail, an
/// upper-case stretch, a mark after punctuation and a multi-byte character
/// each split as they would alone. Negative control: for every pattern, some
/// of these batches split as one text would differ, so a split that looked
/// across document ends would fail here.
#[test]
fn reference_documents_split_as_they_would_alone() {
    let backend = AnyBackend::reference();
    for pattern in Pattern::ALL {
        let cases = boundary_cases();
        let mattering = cases
            .iter()
            .filter(|documents| boundaries_matter(pattern, documents))
            .count();
        assert!(
            mattering >= 10,
            "{pattern:?}: only {mattering} cases cut a piece"
        );
        for geometry in [small(), Geometry::default()] {
            let mut splitter = splitter(&backend, pattern, geometry);
            for (index, documents) in cases.iter().enumerate() {
                check(&mut splitter, documents, &format!("boundary case {index}"));
            }
            // All of them in one batch, so the ends fall anywhere in a block.
            let all: Vec<Vec<u8>> = cases.iter().flatten().cloned().collect();
            check(&mut splitter, &all, "every boundary case");
        }
    }
}

/// Locks out scans that stop at a workgroup boundary or a look-back window:
/// every long run of `split_corpus::long_runs` shortened to about 1.5 KiB
/// (fifty 32-byte blocks, four look-back rounds: digit groups counted across
/// them, a white-space run decided by what follows it, an upper-case stretch
/// by its end), alone (eager and as a graph), after a short document, and cut
/// in two documents in its middle.
#[test]
fn reference_long_runs_cross_many_workgroups() {
    let backend = AnyBackend::reference();
    let runs: Vec<(&str, Vec<u8>)> = split_corpus::long_runs()
        .into_iter()
        .map(|(name, run)| (name, shortened(&run, 1_500)))
        .collect();
    for pattern in Pattern::ALL {
        let mut splitter = splitter(&backend, pattern, small());
        for (name, run) in &runs {
            check(&mut splitter, std::slice::from_ref(run), name);
            check_runs(&mut splitter, &[b"x".to_vec(), run.clone()], name, false);
            let (head, tail) = run.split_at(751);
            check_runs(&mut splitter, &[head.to_vec(), tail.to_vec()], name, false);
        }
    }
}

/// Locks out a split that depends on the block shape: the three shapes at 4 KiB
/// in four documents (one empty) under workgroups of 16 to 256 threads and 1 to
/// 8 bytes per thread, a size that is not a power of two among them; 64 threads
/// of one byte make 65 blocks in workgroups wider than the 32 blocks a
/// look-back's first round reads, so walks go on past that round.
#[test]
fn reference_batches_equal_across_geometries() {
    let backend = AnyBackend::reference();
    let documents: Vec<Vec<u8>> = vec![
        generate(Shape::Prose, 1_500, 11),
        Vec::new(),
        generate(Shape::Cjk, 1_300, 12),
        generate(Shape::Code, 1_300, 13),
    ];
    for (workgroup_size, bytes_per_thread) in
        [(16, 1), (16, 8), (48, 3), (64, 1), (64, 4), (256, 4)]
    {
        let geometry = Geometry {
            workgroup_size,
            bytes_per_thread,
            compact_workgroups: 1,
        };
        for pattern in Pattern::ALL {
            let mut splitter = splitter(&backend, pattern, geometry);
            check(
                &mut splitter,
                &documents,
                &format!("{workgroup_size} threads × {bytes_per_thread} bytes"),
            );
        }
    }
}

/// Locks out trouble with many documents: 3,000 empty documents around two
/// short ones (the window search over the ends takes several rounds and a
/// window holds far more ends than threads), 400 one-byte documents in a row,
/// a batch of only empty documents, and a batch of one empty text.
#[test]
fn reference_many_and_empty_documents() {
    let backend = AnyBackend::reference();
    let mut crowded = vec![Vec::new(); 1_500];
    crowded.push(b"Hello  world 12345".to_vec());
    crowded.extend(vec![Vec::new(); 1_500]);
    crowded.push(b"'s DON'T".to_vec());
    let one_byte: Vec<Vec<u8>> = b"ab 1'.\n\tZz99  "
        .iter()
        .cycle()
        .take(400)
        .map(|&byte| vec![byte])
        .collect();
    for pattern in Pattern::ALL {
        let mut splitter = splitter(&backend, pattern, small());
        check(&mut splitter, &crowded, "3,000 empty documents");
        check(&mut splitter, &one_byte, "400 one-byte documents");
        assert!(splitter.split(b"", &[0, 0, 0]).expect("empty").is_empty());
        assert!(splitter.split(b"", &[]).expect("no documents").is_empty());
    }
}

/// Locks out stale data between batches: one splitter (one set of buffers,
/// one recorded graph reused through its element counts and grid) splits a
/// large batch, then smaller ones whose bytes past their end still hold the
/// large one's, then one that outgrows the graph, alternating eager and graph;
/// and the same on a reference whose atomics apply in reverse order (the
/// tickets, and so the blocks' places, come out reversed).
#[test]
fn reference_graph_and_eager_runs_reuse_buffers_safely() {
    let reversed = AnyBackend::reference_with(ReferenceOptions {
        reverse_atomic_order: true,
        ..ReferenceOptions::default()
    });
    for backend in [AnyBackend::reference(), reversed] {
        for pattern in Pattern::ALL {
            let mut splitter = splitter(&backend, pattern, small());
            for (bytes, documents, seed) in [
                (2_000usize, 5usize, 1u64),
                (300, 2, 2),
                (37, 1, 3),
                (1_000, 9, 4),
                (5_000, 70, 5),
            ] {
                let text = generate(Shape::Code, bytes, seed);
                let mut cuts: Vec<usize> = (1..documents)
                    .map(|index| index * bytes / documents)
                    .collect();
                cuts.push(bytes);
                let mut start = 0;
                let batch: Vec<Vec<u8>> = cuts
                    .into_iter()
                    .map(|end| {
                        let document = text[start..end].to_vec();
                        start = end;
                        document
                    })
                    .collect();
                check(
                    &mut splitter,
                    &batch,
                    &format!("{bytes} bytes in {documents} documents"),
                );
            }
        }
    }
}

/// Locks out batches the contract does not allow: decreasing document ends, a
/// last end that is not the text length, and text without documents are each
/// a `Fix:` error before anything runs; so is a block too large for the
/// device's workgroup memory (8 KiB blocks: refused at 48 KiB, built on an
/// H200's 227 KiB).
#[test]
fn bad_batches_get_fix_errors() {
    for (text_len, ends) in [
        (4usize, &[3u32, 2, 4][..]),
        (4, &[2, 3][..]),
        (4, &[][..]),
        (0, &[1][..]),
    ] {
        let error = check_batch(text_len, ends).unwrap_err();
        assert!(error.message().starts_with("Fix:"), "{error}");
    }
    assert!(check_batch(4, &[0, 4, 4]).is_ok());
    assert!(check_batch(0, &[]).is_ok());
    let mut splitter = splitter(&AnyBackend::reference(), Pattern::Cl100k, small());
    let error = splitter.split(b"abcd", &[5]).unwrap_err();
    assert!(error.message().starts_with("Fix:"), "{error}");
    let largest = SplitPrograms::build(
        Pattern::O200k,
        Geometry {
            workgroup_size: 1024,
            bytes_per_thread: 8,
            compact_workgroups: 1,
        },
    )
    .expect("the device checks workgroup memory");
    let static_limit = AnyBackend::reference_with(ReferenceOptions {
        limits: vyre_cuda::ir::Limits::default(),
        ..Default::default()
    });
    let error = match BatchSplitter::new(&static_limit, largest.clone()) {
        Ok(_) => panic!("8 KiB blocks were compiled under 48 KiB"),
        Err(error) => error,
    };
    assert!(error.message().contains("Fix:"), "{error}");
    assert!(error.message().contains("49152 bytes"), "{error}");
    assert!(BatchSplitter::new(&AnyBackend::reference(), largest).is_ok());
}

/// A buffer per split role (indexed by `SplitBuffer as usize`) for `documents`
/// documents of `text_len` bytes: the text and document ends given (which may
/// run past them), the resident tables uploaded, counters and the piece count
/// at their least size and every other scratch and output `room` times it.
fn split_buffers(
    backend: &AnyBackend,
    programs: &SplitPrograms,
    (text, ends): (&[u8], &[u32]),
    text_len: usize,
    documents: usize,
    room: u64,
) -> Vec<vyre_cuda::backend::DeviceBuffer> {
    let buffers: Vec<vyre_cuda::backend::DeviceBuffer> = SplitBuffer::ALL
        .iter()
        .map(|&buffer| {
            let least = programs
                .buffer_bytes(buffer, text_len, documents)
                .expect("size");
            let bytes = match buffer {
                SplitBuffer::Text => text.len() as u64,
                SplitBuffer::DocumentEnds => 4 * ends.len() as u64,
                SplitBuffer::KindTable | SplitBuffer::Counters | SplitBuffer::PieceCount => least,
                _ => room * least,
            };
            backend.buffer(bytes.max(4)).expect("buffer")
        })
        .collect();
    let table = vyre_tokenizer::pretokenize::batch::table_bytes(programs.pattern()).expect("table");
    for (buffer, bytes) in [
        (SplitBuffer::Text, text),
        (SplitBuffer::DocumentEnds, bytemuck::cast_slice(ends)),
        (SplitBuffer::KindTable, &table[..]),
    ] {
        backend
            .upload(&buffers[buffer as usize], bytes)
            .expect("upload");
    }
    buffers
}

/// The piece starts a run of the steps left in `buffers` (the first
/// `PieceCount` words of `PieceStarts`); `None` for a count past the buffer.
fn piece_starts(
    backend: &AnyBackend,
    buffers: &[vyre_cuda::backend::DeviceBuffer],
) -> Option<Vec<u32>> {
    let count = backend
        .read::<u32>(&buffers[SplitBuffer::PieceCount as usize])
        .expect("count")[0] as usize;
    let starts = backend
        .read::<u32>(&buffers[SplitBuffer::PieceStarts as usize])
        .expect("starts");
    starts.get(..count).map(<[u32]>::to_vec)
}

/// Runs the steps of `programs` from their description alone over `buffers`
/// (indexed by `SplitBuffer as usize`) for a text of `text_len` bytes.
fn run_steps(
    backend: &AnyBackend,
    programs: &SplitPrograms,
    buffers: &[vyre_cuda::backend::DeviceBuffer],
    text_len: usize,
) -> Result<(), vyre_cuda::backend::BackendError> {
    let workgroups = programs.workgroups(text_len);
    for step in programs.steps() {
        let kernel = backend.compile(&step.program, &vyre_cuda::DispatchConfig::linear(1))?;
        let bindings: Vec<vyre_cuda::backend::Binding> = step
            .bindings
            .iter()
            .map(|&buffer| vyre_cuda::backend::Binding::from(&buffers[buffer as usize]))
            .collect();
        let request = vyre_cuda::backend::Dispatch::new(&kernel, &bindings)
            .workgroups([workgroups, 1, 1])
            .readback(&vyre_cuda::ReadbackPolicy::None);
        backend.run(request)?;
    }
    Ok(())
}

/// Locks out a contract another module cannot compose: the steps run from
/// their description alone (`SplitPrograms::steps`, the buffers by role,
/// `workgroups`, `buffer_bytes`) over caller-owned buffers with room to spare
/// (a text buffer longer than the batch, document ends padded with the text
/// length, scratch and outputs twice the least size) give each document's
/// split, twice over the same scratch, and leave the status words and counters
/// zeroed. Negative control: a counter another run left dirty (ticket 1) makes
/// the next run fail (a block waits for a block 0 that never comes, and the
/// reference stops at its work cap) instead of passing. And a status buffer too
/// short for the grid ends the run instead of leaving blocks waiting forever.
#[test]
fn steps_compose_from_their_description() {
    let backend = AnyBackend::reference();
    let documents: Vec<Vec<u8>> = boundary_cases().into_iter().flatten().collect();
    let (mut text, mut ends) = pack(&documents);
    let text_len = text.len();
    text.extend_from_slice(b"bytes past the last document end are never read");
    ends.extend([text_len as u32; 3]);
    for pattern in Pattern::ALL {
        let programs = SplitPrograms::build(pattern, small()).expect("geometry");
        let table = vyre_tokenizer::pretokenize::batch::table_bytes(pattern).expect("table");
        assert_eq!(
            table.len() as u64,
            programs
                .buffer_bytes(SplitBuffer::KindTable, text_len, documents.len())
                .expect("size"),
            "the resident tables' bytes"
        );
        // Scratch and outputs with twice the room they need.
        let buffers = split_buffers(
            &backend,
            &programs,
            (&text, &ends),
            text_len,
            documents.len(),
            2,
        );
        let expected = expected_starts(pattern, &documents);
        for round in 0..2 {
            run_steps(&backend, &programs, &buffers, text_len).expect("steps");
            assert_eq!(
                piece_starts(&backend, &buffers),
                Some(expected.clone()),
                "{pattern:?} round {round}"
            );
            for scratch in [SplitBuffer::Statuses, SplitBuffer::Counters] {
                let bytes = backend
                    .read::<u8>(&buffers[scratch as usize])
                    .expect("scratch");
                assert!(
                    bytes.iter().all(|&byte| byte == 0),
                    "{pattern:?} round {round}: {} left dirty",
                    scratch.name()
                );
            }
        }
        if pattern == Pattern::Gpt2 {
            let capped = AnyBackend::reference_with(ReferenceOptions {
                max_work: 1 << 27,
                ..ReferenceOptions::default()
            });
            let dirty: Vec<vyre_cuda::backend::DeviceBuffer> = SplitBuffer::ALL
                .iter()
                .map(|&buffer| {
                    let bytes = backend.read::<u8>(&buffers[buffer as usize]).expect("copy");
                    capped.buffer_from(&bytes).expect("buffer")
                })
                .collect();
            run_steps(&capped, &programs, &dirty, text_len).expect("a clean run");
            capped
                .upload(&dirty[SplitBuffer::Counters as usize], &[1u32, 0])
                .expect("dirty counter");
            let error = run_steps(&capped, &programs, &dirty, text_len).unwrap_err();
            assert!(error.to_string().contains("Fix:"), "{error}");
            // Status words bound too few for the grid: the run still ends (the
            // words past the buffer read as finished), it does not wait forever.
            let mut short = dirty;
            short[SplitBuffer::Counters as usize] = capped.buffer(8).expect("counters");
            short[SplitBuffer::Statuses as usize] = capped.buffer(8).expect("statuses");
            run_steps(&capped, &programs, &short, text_len).expect("a run that ends");
        }
    }
}

/// Locks out a lone workgroup that still runs the protocol between workgroups
/// (a ticket by fetch-add, status words, a done count and the last one's
/// clear) on its serial path: a text of one block, split by one workgroup per
/// step over counters holding a stale ticket and done count and status words
/// holding stale words, gives each document's split and leaves the counters
/// and status words exactly as they were (a workgroup alone takes ticket 0 and
/// neither publishes, counts nor clears). Negative control: the same stale
/// buffers under a text of several blocks make the run fail (its workgroups
/// read them), so the lone run passes for not reading them, not by luck.
#[test]
fn a_lone_workgroup_leaves_the_protocol_out() {
    let capped = AnyBackend::reference_with(ReferenceOptions {
        max_work: 1 << 27,
        ..ReferenceOptions::default()
    });
    for pattern in Pattern::ALL {
        let programs = SplitPrograms::build(pattern, small()).expect("geometry");
        let lone = vec![b"Hi, it's 12".to_vec(), b" o'clock".to_vec(), Vec::new()];
        let several: Vec<Vec<u8>> = boundary_cases().into_iter().flatten().collect();
        for (documents, alone) in [(&lone, true), (&several, false)] {
            let (text, ends) = pack(documents);
            assert_eq!(
                programs.workgroups(text.len()) == 1,
                alone,
                "{pattern:?}: {} bytes",
                text.len()
            );
            let buffers = split_buffers(
                &capped,
                &programs,
                (&text, &ends),
                text.len(),
                documents.len(),
                1,
            );
            capped
                .upload(&buffers[SplitBuffer::Counters as usize], &[5u32, 3])
                .expect("stale counters");
            let statuses = &buffers[SplitBuffer::Statuses as usize];
            let stale: Vec<u64> = (0..statuses.len() / 8)
                .map(|index| (2 << 62) | (index + 1))
                .collect();
            capped.upload(statuses, &stale).expect("stale statuses");
            let run = run_steps(&capped, &programs, &buffers, text.len());
            let untouched = || {
                capped
                    .read::<u32>(&buffers[SplitBuffer::Counters as usize])
                    .expect("counters")
                    == [5, 3]
                    && capped.read::<u64>(statuses).expect("statuses") == stale
            };
            let expected = expected_starts(pattern, documents);
            if alone {
                run.expect("a lone workgroup's steps");
                assert_eq!(
                    piece_starts(&capped, &buffers),
                    Some(expected),
                    "{pattern:?}"
                );
                assert!(untouched(), "{pattern:?}: counters or status words written");
            } else {
                assert!(
                    run.is_err()
                        || piece_starts(&capped, &buffers) != Some(expected)
                        || !untouched(),
                    "{pattern:?}: several blocks ran over stale counters as if clean"
                );
            }
        }
    }
}

/// Locks out a step description that drifts from its program: every step binds
/// exactly its program's global buffers, by name and element type, in binding
/// order, and every buffer a step binds has a size.
#[test]
fn steps_bind_exactly_their_programs_buffers() {
    for pattern in Pattern::ALL {
        let programs = SplitPrograms::new(pattern);
        for step in programs.steps() {
            let declared = step.program.global_buffers();
            assert_eq!(
                declared.len(),
                step.bindings.len(),
                "{pattern:?} {}",
                step.name
            );
            for (decl, buffer) in declared.iter().zip(step.bindings) {
                assert_eq!(&*decl.name, buffer.name(), "{pattern:?} {}", step.name);
                assert_eq!(decl.elem, buffer.element(), "{pattern:?} {}", step.name);
                assert!(programs.buffer_bytes(*buffer, 1_000, 3).expect("size") > 0);
            }
        }
        assert_eq!(programs.workgroups(0), 1);
        assert_eq!(programs.workgroups(1_025), 2);
    }
}

/// Locks out look-back paths lockstep never takes: on the reference in
/// lockstep every block publishes its aggregate at the same statement and
/// walks back to the first block, while on the device a block mostly finds a
/// nearer block's finished prefix. Run one workgroup at a time (ascending, and
/// descending so tickets and hardware indexes disagree), every block finds its
/// predecessor finished: prose as one document and in five, a digit run alone
/// and after a one-byte document, each eager and as a graph.
#[test]
fn reference_workgroups_in_turn_find_finished_prefixes() {
    for order in [WorkgroupOrder::InTurn, WorkgroupOrder::InTurnReversed] {
        let backend = AnyBackend::reference_with(ReferenceOptions {
            workgroup_order: order,
            ..ReferenceOptions::default()
        });
        let prose = generate(Shape::Prose, 3_000, 42);
        let documents: Vec<Vec<u8>> = prose.chunks(700).map(<[u8]>::to_vec).collect();
        let digits = "7".repeat(1_500).into_bytes();
        for pattern in Pattern::ALL {
            let mut splitter = splitter(&backend, pattern, small());
            for (what, batch) in [
                ("prose", vec![prose.clone()]),
                ("prose in documents", documents.clone()),
                ("digits", vec![digits.clone()]),
                ("x, digits", vec![b"x".to_vec(), digits.clone()]),
            ] {
                check(&mut splitter, &batch, &format!("{order:?}, {what}"));
            }
        }
    }
}

/// The statements of `block` in program order, nested blocks in place.
fn flattened(block: &[Node], into: &mut Vec<Node>) {
    for node in block {
        into.push(node.clone());
        match node {
            Node::If {
                then_body,
                else_body,
                ..
            } => {
                flattened(then_body, into);
                flattened(else_body, into);
            }
            Node::Loop { body, .. } | Node::While { body, .. } => flattened(body, into),
            _ => {}
        }
    }
}

/// What is wrong with `program`'s end-of-dispatch protocol: its done count (the
/// last fetch-add on `counters`) must come after every exchange of a status
/// word with a fence between, and before every store to a status word (the
/// clear) with a fence between.
fn finish_protocol_problems(program: &Program) -> Vec<String> {
    let mut nodes = Vec::new();
    flattened(program.entry(), &mut nodes);
    let is_fence = |node: &Node| matches!(node, Node::Fence);
    let exchanges: Vec<usize> = (0..nodes.len())
        .filter(|&at| {
            matches!(&nodes[at], Node::Atomic { op: AtomicOp::Exchange, buffer, .. } if &**buffer == "statuses")
        })
        .collect();
    let clears: Vec<usize> = (0..nodes.len())
        .filter(|&at| matches!(&nodes[at], Node::Store { buffer, .. } if &**buffer == "statuses"))
        .collect();
    let Some(count) = (0..nodes.len()).rev().find(|&at| {
        matches!(&nodes[at], Node::AtomicFetch { op: AtomicOp::Add, buffer, .. } if &**buffer == "counters")
    }) else {
        return vec!["no done count".to_owned()];
    };
    let mut problems = Vec::new();
    match exchanges.last() {
        Some(&last) if last < count => {
            if !nodes[last..count].iter().any(is_fence) {
                problems.push(
                    "no fence between the last status exchange and the done count".to_owned(),
                );
            }
        }
        _ => problems.push("a status exchange after the done count, or none".to_owned()),
    }
    match clears.first() {
        Some(&first) if first > count => {
            if !nodes[count..first].iter().any(is_fence) {
                problems.push("no fence between the done count and the clear".to_owned());
            }
        }
        _ => problems.push("a status store before the done count, or none".to_owned()),
    }
    problems
}

/// Locks out the stale status word the first H200 run tripped over: the IR's
/// atomics are relaxed, so without a fence between a block's last status
/// exchange and its done count, and another between the count and the last
/// block's clear, an exchange may land after the clear and the next dispatch
/// reads this one's prefix (no CPU order can show it: the interpreter is
/// sequentially consistent). Every step of every pattern, at two geometries,
/// has both fences; negative control: the same steps without fences fail.
#[test]
fn finish_fences_every_status_exchange_before_the_clear() {
    for pattern in Pattern::ALL {
        for geometry in [Geometry::default(), small()] {
            let programs = SplitPrograms::build(pattern, geometry).expect("geometry");
            for step in programs.steps() {
                let problems = finish_protocol_problems(&step.program);
                assert!(
                    problems.is_empty(),
                    "{pattern:?} {}: {problems:?}",
                    step.name
                );
                let program = &step.program;
                let unfenced = Program::new(
                    program.buffers().to_vec(),
                    program.workgroup_size(),
                    without(program.entry(), &|node| matches!(node, Node::Fence)),
                );
                assert_eq!(
                    finish_protocol_problems(&unfenced).len(),
                    2,
                    "{pattern:?} {}: the control without fences passed",
                    step.name
                );
            }
        }
    }
}

/// Whether every load of `codes` before the first barrier of `printed` (a
/// program as `Display` prints it) comes before every store into `window`.
fn window_loads_before_stores(printed: &str) -> bool {
    let fill: Vec<&str> = printed
        .lines()
        .map(str::trim)
        .take_while(|line| !line.starts_with("workgroup_barrier"))
        .collect();
    let last_load = fill.iter().rposition(|line| line.contains("codes["));
    let first_store = fill.iter().position(|line| line.starts_with("window["));
    matches!((last_load, first_store), (Some(load), Some(store)) if load < store)
}

/// Locks out a `phases` window fill whose rounds each store before the next
/// round loads: a warp issues in order, so each round then waited a whole
/// memory round trip for the one before (13 % of the step's warp samples on
/// the H200). For cl100k and o200k, at the default split, the bulk split's
/// 8 KiB blocks and the small test blocks, every `codes` load of the fill
/// precedes every `window` store; (negative control) a fill that stores each
/// round after its load fails the check.
#[test]
fn phases_loads_its_whole_window_before_storing_it() {
    let bulk = BulkSplit::default().split;
    for pattern in [Pattern::Cl100k, Pattern::O200k] {
        for geometry in [Geometry::default(), bulk, small()] {
            let programs = SplitPrograms::build(pattern, geometry).expect("geometry");
            let phases = programs
                .steps()
                .iter()
                .find(|step| step.name == "phases")
                .expect("a phases step");
            assert!(
                window_loads_before_stores(&phases.program.to_string()),
                "{pattern:?} at {geometry:?}"
            );
        }
    }
    let interleaved = "\
        let mut loaded0 = 0u;\n\
        if (inside0) {\n    loaded0 = codes[position0];\n}\n\
        window[slot0] = loaded0;\n\
        let mut loaded1 = 0u;\n\
        if (inside1) {\n    loaded1 = codes[position1];\n}\n\
        window[slot1] = loaded1;\n\
        workgroup_barrier();\n";
    assert!(!window_loads_before_stores(interleaved));
}

/// Locks out a joined-pairs table that the device reads otherwise than the
/// CPU encoder's `Vocabulary::joins`: the words `cutting_table_bytes` appends
/// after the split's resident tables (at `joined_pairs_start`), read as the
/// cutting split reads them (little-endian `u32` word `pair / 32`, bit
/// `pair % 32`, `pair = first << 8 | second`), hold exactly the pairs `joins`
/// says, for all four encodings, and the buffer's size is what
/// `buffer_bytes` asks for; a table of another length is a `Fix:` error.
/// (Negative control: the same words read big-endian disagree.)
#[test]
fn the_cutting_split_reads_the_joined_pairs_the_cpu_encoder_does() {
    use vyre_tokenizer::pretokenize::batch::{
        cutting_table_bytes, joined_pairs_start, table_bytes, JOINED_PAIR_WORDS,
    };
    use vyre_tokenizer::{Encoding, Tokenizer};
    for encoding in Encoding::ALL {
        let tokenizer = Tokenizer::for_encoding(encoding).unwrap();
        let pattern = tokenizer.pattern();
        let vocabulary = tokenizer.vocabulary();
        let bytes = cutting_table_bytes(pattern, vocabulary.joined_pair_bits()).unwrap();
        let start = joined_pairs_start(pattern).unwrap() as usize;
        assert_eq!(start * 4, table_bytes(pattern).unwrap().len());
        assert_eq!(bytes.len(), 4 * (start + JOINED_PAIR_WORDS as usize));
        let programs = SplitPrograms::build_cutting_unjoined(pattern, small()).unwrap();
        assert_eq!(
            programs.buffer_bytes(SplitBuffer::KindTable, 0, 0).unwrap(),
            bytes.len() as u64
        );
        let word = |index: usize, little: bool| {
            let at = 4 * (start + index);
            let four: [u8; 4] = bytes[at..at + 4].try_into().unwrap();
            match little {
                true => u32::from_le_bytes(four),
                false => u32::from_be_bytes(four),
            }
        };
        let mut joined = 0;
        let mut big_endian_disagrees = false;
        for pair in 0..1usize << 16 {
            let expected = vocabulary.joins((pair >> 8) as u8, pair as u8);
            let read = |little| word(pair / 32, little) >> (pair % 32) & 1 == 1;
            assert_eq!(read(true), expected, "{}: pair {pair:04X}", encoding.name());
            big_endian_disagrees |= read(false) != expected;
            joined += usize::from(expected);
        }
        assert!(big_endian_disagrees, "{}", encoding.name());
        assert!(
            joined > 2000 && joined < 65536,
            "{}: {joined}",
            encoding.name()
        );
        let error = cutting_table_bytes(pattern, &[0u64; 3])
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("Fix:"), "{error}");
    }
}
