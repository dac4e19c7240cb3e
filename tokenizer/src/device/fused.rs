//! The fused programs: every kernel step in one program, so a short or
//! mid-size text costs one dispatch instead of one per step. The short-text
//! program runs in one workgroup, each step's grid in turn; the resident-grid
//! program on as many workgroups as the device holds at once (see below).
//!
//! # Why it exists
//!
//! An encode is eight dependent steps (seven for r50k and p50k), each its own
//! dispatch on its own stream, ordered after the ones before by events. On the
//! H200 (2026-12-01) one 1,024-byte text took 142 µs eagerly, against 179 µs for
//! tiktoken-rs on one CPU thread, while the same encoder ran 16 MiB chunks at
//! about 5 ms of kernels: a short text pays for launches and the waits between
//! them, not for work. Here the steps run back to back inside one kernel with a
//! workgroup barrier between them. `stage` ran as a dispatch of its own before
//! this program (its text buffer of `u64` words, where every other step reads
//! bytes) until a 1 KiB encode measured 83.6 µs on the H200 (2026-12-02) of
//! which `stage` took 13.8, its launch included; the steps now start with
//! [`short_stage`](super::programs::short_stage), the same copies storing bytes.
//! The steps are built for [`Geometry::short`], the workgroup of
//! [`ShortText`](super::programs::ShortText) (see there for why its own).
//!
//! # How
//!
//! [`short_program`] takes the steps' programs and rewrites each body as the
//! body of a loop over that step's workgroups, `group = 0, 1, ...` below the
//! count its [`Grid`] gives for the text length, the dispatch's scalar
//! [`TEXT_LEN_SCALAR`] (uniform, so every loop bound is; one group for `stage`
//! and `pieces`, which stride over their work themselves; `stage` also takes
//! the number of documents from [`DOCUMENTS_SCALAR`]):
//! `workgroup_id.x` becomes the loop variable, `workgroup_count.x` the count,
//! `global_id.x` `group · W + local_id.x`, the y and z axes 0 and 1. The
//! steps' global buffers are bound once per [`Role`] (read-write where any step
//! writes it); a step's workgroup buffer takes an earlier step's of the same
//! element type, grown to the larger count (steps never run at once, and the
//! sum of every step's buffers was over the static 48 KiB for o200k: the
//! `merge` step's slabs alone were 12 KiB before the fused build kept short
//! ranges in registers (a `Geometry::fused_merge_slab_bytes` slab brings one
//! back), and the tree lowering of the workgroup reductions adds about 30 KiB
//! of its own), and a step clears its
//! part of each before each of its groups, as a launch clears them for every
//! workgroup. A barrier ends every group, so what one group or step wrote is
//! visible to the next. Workgroups that run in turn are one valid
//! order of a launch's workgroups, and every step already works for any order
//! (the split's look-back waits only on earlier workgroups, which here have
//! finished), so the ids are the same as the steps' dispatched one by one.
//! A step's device-scope fences (`Node::Fence`: its status words and its
//! counter of finished workgroups, whose readers are other workgroups when it
//! runs alone) become workgroup-scope ones (`Node::WorkgroupFence`, PTX
//! `fence.acq_rel.cta`): every reader is now in the writer's workgroup, and a
//! device-scope fence waits for the thread's earlier writes to reach the whole
//! device. `classify`, `phases` and `compact` each take two of them per group,
//! on one thread, between its atomics, in the serial part of the step.
//!
//! # The resident grid: the same steps for mid-size texts
//!
//! A text of a few hundred KiB is too much work for one workgroup and still
//! pays for eight dispatches: on the H200 (2026-12-02) 256 KiB of prose took
//! 221 µs eagerly, of which the kernels were 120 µs and the rest the launches,
//! the cross-stream waits between dependent steps and the host's work for
//! each. [`resident_program`] applies the same rewrite for a grid of `G`
//! workgroups that are all on the device at once (a cooperative launch; the
//! encoder asks for at most what the device holds): in round `r` workgroup
//! `w` runs group `r · G + w` of the step, every workgroup the same number of
//! rounds (the last round's extra workgroups idle through it, so every bound
//! stays uniform), and a grid sync ends every step but the last, so what any
//! group of a step wrote is visible to every group of the next. `stage` and
//! `pieces`, which stride over their work by the grid's size, run one group
//! per workgroup. The steps are built for a fused kernel
//! ([`SplitBuild::Fused`](crate::pretokenize::batch::SplitBuild), the
//! encoder's `StepBuild::Fused`): a look-back orders blocks by their group's
//! index, not by a ticket taken as it starts. A group waits only for groups of
//! lower index, which ran in an earlier round (every workgroup runs its rounds
//! in order) or run in this one on a resident workgroup, and the lowest group
//! not yet done waits for none, so every wait ends; in the short-text program
//! the groups run in index order, so every group it waits for has finished.
//! The split's steps leave their status words to a later step there instead
//! of counting themselves done (a contended atomic and two fences on each
//! group's serial path), which the barriers and grid syncs between steps make
//! safe.

use std::collections::BTreeMap;

use vyre_cuda::ir::{
    Access, Axis, BinaryOp, BufferCount, BufferDecl, Builtin, Expr, Literal, Name, Node, Program,
    Rebuild, ScalarType,
};

use super::programs::{param, Geometry, Grid, KernelStep, Role, MERGE_BYTES_PER_THREAD};

/// Most text bytes an encode takes through the short-text program.
pub const SHORT_TEXT_BYTES: u64 = 4096;

/// Default most text bytes a chunk takes through the short-text program
/// ([`ChunkLimits::short_text_bytes`](super::pipeline::ChunkLimits)): 2 KiB,
/// the largest size at which its one workgroup still beat the resident grid.
/// On the H200 (2026-12-05, the `gpu_encode` bench's resident rows, eager,
/// median of 250, two runs) one document of 1 / 2 / 3 / 4 KiB took, through
/// the short-text kernel, 50.9 / 70.1–70.7 / 101.7–101.8 / 120.4–120.7 µs of
/// prose against 72.7–73.7 µs at every size through the resident grid, CJK
/// 53.4–53.7 / 75.4–75.9 / 105.8–106.0 / 127.1–127.2 against 71.4–79.0, code
/// 70.9–72.0 / 93.1 / 113.9–114.3 / 133.3–134.0 against 91.2–101.3: one
/// workgroup's serial depth grows with the text, while the resident grid
/// spreads each step over a workgroup per 1 KiB block.
pub const DEFAULT_SHORT_TEXT_BYTES: u64 = 2048;

/// Default most text bytes a chunk takes through the resident-grid program:
/// 256 KiB, the largest size at which it was the faster path for prose and CJK
/// and even for code. On the H200 (2026-12-05, the `gpu_encode` bench's rows,
/// eager, median of 250) one cooperative dispatch took, at 8 / 64 / 128 /
/// 256 KiB, 81.9 / 98.2 / 111.5 / 142.7 µs of prose where every step its own
/// dispatch took 96.4 / 115.9 / 127.9 / 161.6, CJK 87.8 / 101.6 / 128.5 /
/// 186.4 against 97.2 / 117.9 / 142.3 / 197.5, code 105.6 / 124.6 / 138.5 /
/// 193.0 against 123.7 / 143.0 / 158.3 / 191.4; at 512 KiB CJK and code were
/// slower (423.1 / 410.3, 319.4 / 272.7): the fused kernel's own time (one
/// register budget and one grid for every step, a grid sync between steps;
/// 88.9 against 75.2 µs of kernels for 256 KiB of prose) grows past the
/// launches and the waits between dependent steps that it saves. With the
/// text of a 256 KiB slot brought up by the copy engine
/// ([`TEXT_COPY_ENGINE_FROM`](super::pipeline::TEXT_COPY_ENGINE_FROM)), the
/// same day's A/B call (two rounds) measured 256 KiB eager through the default
/// encoder at prose 149.9 / 153.4 µs against 167.7 / 166.3 step by step, CJK
/// 185.0 / 194.3 against 200.3 / 202.5, code 185.6 / 191.6 against 182.7 /
/// 183.9. (On 2026-12-02, before the steps' later changes, 256 KiB was
/// already even for prose and slower for CJK and code, and the default was
/// 128 KiB.)
pub const RESIDENT_TEXT_BYTES: u64 = 256 << 10;

/// A fused program, how it runs its steps' groups, and the role of each of its
/// global buffers, in binding order.
#[derive(Clone, Debug)]
pub struct ShortProgram {
    /// The program: one workgroup runs it, or a resident grid ([`Spread`]).
    pub program: Program,
    /// How it runs each step's groups.
    pub spread: Spread,
    /// One role per global buffer, in binding order.
    pub bindings: Vec<Role>,
    /// Its steps' names, in order: whose clocks it keeps in `params`
    /// ([`param::STEP_CLOCK`]).
    pub step_names: Vec<&'static str>,
}

/// Names this module gives its own variables and buffers: a prefix no step's
/// names start with (checked).
const PREFIX: &str = "short_";

/// The scalar parameter (`u32`) of every fused program: the chunk's text
/// length in bytes, which bounds each step's loop over its groups. A dispatch
/// of a fused kernel gives it ([`vyre_cuda::backend::Dispatch::scalar`]). Why
/// a scalar: the program used to read it from the staged parameters, where
/// `stage` had not yet copied them, which on CUDA are host-mapped memory: one
/// PCIe round trip at the kernel's entry, and a workgroup reduction to make
/// the value uniform, before any step began.
pub const TEXT_LEN_SCALAR: &str = "text_len";

/// The other scalar parameter (`u32`) of every fused program: the chunk's
/// number of documents, which `stage` needs for every document end it writes
/// (the ends past the last document are the text length). Why a scalar: read
/// from the staged parameters it was a load of host-mapped memory by every
/// thread of the grid (on CUDA), each warp's its own request across PCIe, on
/// the way to the grid's first sync.
pub const DOCUMENTS_SCALAR: &str = "documents";

/// The fused programs' scalar parameters, in their declared order.
const FUSED_SCALARS: [&str; 2] = [TEXT_LEN_SCALAR, DOCUMENTS_SCALAR];

/// The steps after `stage` (`steps`, in dispatch order) as one program for one
/// workgroup; `Err` naming what the rewrite cannot take (a grid sync, a
/// write-only or per-thread buffer, one role with two element types, steps of
/// different workgroup sizes).
pub fn short_program(steps: &[KernelStep], geometry: &Geometry) -> Result<ShortProgram, String> {
    fused_program(steps, geometry, Spread::OneWorkgroup)
}

/// The steps (`steps`, in dispatch order) as one program for a grid of
/// workgroups that are all resident at once (launched cooperatively): each
/// step's groups dealt out over the grid's workgroups in rounds, a grid sync
/// between steps; `Err` as [`short_program`].
pub fn resident_program(steps: &[KernelStep], geometry: &Geometry) -> Result<ShortProgram, String> {
    fused_program(steps, geometry, Spread::ResidentGrid)
}

/// How a fused program runs each step's groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spread {
    /// One workgroup runs them all in turn; a workgroup barrier between steps.
    OneWorkgroup,
    /// Workgroup `w` of `G` runs groups `w, w + G, ...`; a grid sync between
    /// steps.
    ResidentGrid,
}

impl Spread {
    /// The fused kernel's step name in timings and its program's op id:
    /// `short` or `resident`.
    pub fn step_name(self) -> &'static str {
        match self {
            Spread::OneWorkgroup => "short",
            Spread::ResidentGrid => "resident",
        }
    }
}

fn fused_program(
    steps: &[KernelStep],
    geometry: &Geometry,
    spread: Spread,
) -> Result<ShortProgram, String> {
    let Some(first) = steps.first() else {
        return Err("the short-text program needs at least one step".to_owned());
    };
    let workgroup_size = first.program.workgroup_size();
    if workgroup_size[1] != 1 || workgroup_size[2] != 1 {
        return Err(format!(
            "the short-text program takes one-dimensional workgroups; `{}` has {workgroup_size:?}",
            first.program_name()
        ));
    }
    let threads = workgroup_size[0];
    // One declaration per role, in the order the steps first bind them.
    let mut globals: Vec<(Role, BufferDecl)> = Vec::new();
    // Workgroup memory: steps run one after another, so a step's buffer takes
    // an earlier step's of the same element type (the sum of every step's
    // buffers is over the static 48 KiB for o200k).
    let mut workgroup_buffers: Vec<BufferDecl> = Vec::new();
    let mut renames: Vec<BTreeMap<Name, Name>> = Vec::new();
    let mut cleared: Vec<Vec<BufferDecl>> = Vec::new();
    for step in steps {
        let name = step.program_name();
        if step.program.workgroup_size() != workgroup_size {
            return Err(format!(
                "the short-text program needs one workgroup size; `{name}` has {:?}, `{}` {workgroup_size:?}",
                step.program.workgroup_size(),
                first.program_name()
            ));
        }
        // The scalars a step may declare are the fused program's own.
        if step
            .program
            .scalars()
            .iter()
            .any(|decl| !FUSED_SCALARS.contains(&&*decl.name) || decl.ty != ScalarType::U32)
        {
            return Err(format!(
                "`{name}` declares scalar parameters other than the `u32` {TEXT_LEN_SCALAR} and {DOCUMENTS_SCALAR}"
            ));
        }
        let mut rename = BTreeMap::new();
        let mut taken: Vec<BufferDecl> = Vec::new();
        let mut global_decls: Vec<&BufferDecl> = step
            .program
            .buffers()
            .iter()
            .filter(|decl| matches!(decl.access, Access::ReadOnly | Access::ReadWrite))
            .collect();
        global_decls.sort_by_key(|decl| decl.binding);
        if global_decls.len() != step.bindings.len() {
            return Err(format!(
                "`{name}` has {} global buffers for {} roles",
                global_decls.len(),
                step.bindings.len()
            ));
        }
        for decl in step.program.buffers() {
            if decl.name.starts_with(PREFIX) {
                return Err(format!("`{name}` names a buffer `{}`", decl.name));
            }
            match decl.access {
                Access::ReadOnly | Access::ReadWrite => {}
                Access::Workgroup => {
                    let BufferCount::Static(count) = decl.count else {
                        return Err(format!(
                            "`{name}`'s workgroup buffer `{}` has no static count",
                            decl.name
                        ));
                    };
                    // The largest free one of the element type, grown to the
                    // count if it is smaller.
                    let free = workgroup_buffers
                        .iter_mut()
                        .filter(|pooled| {
                            pooled.elem == decl.elem
                                && !taken.iter().any(|used| used.name == pooled.name)
                        })
                        .max_by_key(|pooled| static_count(pooled));
                    let pooled = match free {
                        Some(pooled) => {
                            pooled.count = BufferCount::Static(static_count(pooled).max(count));
                            pooled.clone()
                        }
                        None => {
                            let pooled = BufferDecl::new(
                                format!("{PREFIX}workgroup_{}", workgroup_buffers.len()),
                                0,
                                Access::Workgroup,
                                decl.elem,
                                decl.count,
                            );
                            workgroup_buffers.push(pooled.clone());
                            pooled
                        }
                    };
                    rename.insert(decl.name.clone(), pooled.name.clone());
                    // The step clears (and uses) its own count of the pooled buffer.
                    taken.push(BufferDecl::new(
                        pooled.name.clone(),
                        0,
                        Access::Workgroup,
                        decl.elem,
                        decl.count,
                    ));
                }
                other => {
                    return Err(format!(
                        "`{name}`'s buffer `{}` is {other:?}, which the short-text program does not take",
                        decl.name
                    ))
                }
            }
        }
        for (decl, &role) in global_decls.iter().zip(&step.bindings) {
            rename.insert(decl.name.clone(), Name::from(role.name()));
            match globals.iter_mut().find(|(bound, _)| *bound == role) {
                Some((_, existing)) => {
                    // A static count and a runtime one bind the same buffer: the
                    // runtime length serves both.
                    let count = match (existing.count, decl.count) {
                        (before, now) if before == now => Some(now),
                        (BufferCount::Runtime, _) | (_, BufferCount::Runtime) => {
                            Some(BufferCount::Runtime)
                        }
                        _ => None,
                    };
                    let (Some(count), true) = (count, existing.elem == decl.elem) else {
                        return Err(format!(
                            "`{}` is {:?} × {:?} in `{name}` and {:?} × {:?} before it",
                            role.name(),
                            decl.elem,
                            decl.count,
                            existing.elem,
                            existing.count
                        ));
                    };
                    existing.count = count;
                    if decl.access == Access::ReadWrite {
                        existing.access = Access::ReadWrite;
                    }
                }
                None => globals.push((
                    role,
                    BufferDecl::new(role.name(), 0, decl.access, decl.elem, decl.count),
                )),
            }
        }
        renames.push(rename);
        cleared.push(taken);
    }

    let roles: Vec<Role> = globals.iter().map(|(role, _)| *role).collect();
    let buffers: Vec<BufferDecl> = globals
        .into_iter()
        .map(|(_, decl)| decl)
        .chain(workgroup_buffers)
        .enumerate()
        .map(|(binding, mut decl)| {
            decl.binding = binding as u32;
            decl
        })
        .collect();

    let text_len: Name = format!("{PREFIX}text_len").into();
    if !roles.contains(&Role::Params) {
        return Err("the fused program needs `params`, where it keeps its step clocks".to_owned());
    }
    if steps.len() > param::STEP_CLOCKS as usize {
        return Err(format!(
            "the fused program keeps at most {} step clocks; it has {} steps",
            param::STEP_CLOCKS,
            steps.len()
        ));
    }
    let clock_start: Name = format!("{PREFIX}clock_start").into();
    let mut entry = vec![
        Node::Let {
            name: clock_start.clone(),
            mutable: false,
            value: Expr::clock(),
        },
        // The text length, before any step runs (before `stage` copies the
        // staged parameters into `params`): the dispatch's scalar.
        Node::Let {
            name: text_len.clone(),
            mutable: false,
            value: Expr::scalar(TEXT_LEN_SCALAR),
        },
    ];
    for (index, (step, rename)) in steps.iter().zip(&renames).enumerate() {
        let group: Name = format!("{PREFIX}group_{index}").into();
        let groups: Name = format!("{PREFIX}groups_{index}").into();
        entry.push(Node::Let {
            name: groups.clone(),
            mutable: false,
            value: group_count(
                step.grid,
                geometry,
                threads,
                Expr::Var(text_len.clone()),
                spread,
            ),
        });
        let mut rewrite = Rewrite {
            group: &group,
            groups: &groups,
            threads,
            rename,
            spread,
        };
        let mut body = clear_workgroup_buffers(&cleared[index], threads);
        body.extend(rewrite.block(step.program.entry())?.iter().cloned());
        body.push(Node::Barrier);
        match spread {
            Spread::OneWorkgroup => entry.push(Node::Loop {
                variable: group,
                start: Expr::u32(0),
                end: Expr::Var(groups),
                body: body.into(),
            }),
            Spread::ResidentGrid => {
                // Round `r` of workgroup `w` runs group `r · G + w`: every
                // workgroup the same number of rounds (so the bound is uniform),
                // the last round's extra workgroups idle through it.
                let round: Name = format!("{PREFIX}round_{index}").into();
                let workgroups = Expr::workgroup_count(Axis::X);
                let mut in_round = vec![Node::Let {
                    name: group.clone(),
                    mutable: false,
                    value: Expr::Var(round.clone()) * workgroups.clone()
                        + Expr::workgroup_id(Axis::X),
                }];
                in_round.push(Node::If {
                    condition: Expr::Var(group).less_than(Expr::Var(groups.clone())),
                    then_body: body.into(),
                    else_body: Vec::new().into(),
                });
                entry.push(Node::Loop {
                    variable: round,
                    start: Expr::u32(0),
                    end: (Expr::Var(groups) + (workgroups.clone() - 1u32)) / workgroups,
                    body: in_round.into(),
                });
                // What every group of this step wrote, seen by every group of
                // the next.
                if index + 1 < steps.len() {
                    entry.push(Node::GridSync);
                }
            }
        }
        entry.push(step_clock(index, &clock_start));
    }
    let program = FUSED_SCALARS
        .iter()
        .fold(Program::builder(workgroup_size), |builder, name| {
            builder.scalar(*name, ScalarType::U32)
        })
        .build()
        .with_entry(buffers.into(), entry.into())
        .with_entry_op_id(format!(
            "bpe.{}.{}",
            spread.step_name(),
            first.program_name()
        ));
    Ok(ShortProgram {
        program,
        spread,
        bindings: roles,
        step_names: steps.iter().map(|step| step.name).collect(),
    })
}

/// Thread 0 of workgroup 0 keeps the clock since `clock_start` (saturated to a
/// `u32`) in `params` as step `index`'s end ([`param::STEP_CLOCK`]): after the
/// barrier (one workgroup) or grid sync (a resident grid) that ends the step,
/// so every group of it has finished, except that a resident grid's last step
/// has no sync after it and its clock is workgroup 0's own end. `stage` (the
/// first step) copies the staged parameters' zeros over these words before its
/// own clock is kept.
fn step_clock(index: usize, clock_start: &Name) -> Node {
    let elapsed = Expr::binary(
        BinaryOp::Min,
        Expr::clock() - Expr::Var(clock_start.clone()),
        Expr::u64(u64::from(u32::MAX)),
    );
    Node::If {
        condition: Expr::binary(
            BinaryOp::LogicalAnd,
            Expr::local_id(Axis::X).equals(0u32),
            Expr::workgroup_id(Axis::X).equals(0u32),
        ),
        then_body: vec![Node::Store {
            buffer: Name::from(Role::Params.name()),
            index: Expr::u32(param::STEP_CLOCK + index as u32),
            value: elapsed.cast(ScalarType::U32),
        }]
        .into(),
        else_body: Vec::new().into(),
    }
}

/// The element count of a workgroup buffer (static: checked when pooled).
fn static_count(decl: &BufferDecl) -> u32 {
    match decl.count {
        BufferCount::Static(count) => count,
        BufferCount::Runtime => 0,
    }
}

/// `⌈value / divisor⌉`, at least 1.
fn groups_of(value: Expr, divisor: u32) -> Expr {
    ((value + (divisor - 1)) / divisor).max(1u32)
}

/// How many workgroups a step of `grid` runs (as [`Grid::workgroups`], but one
/// for `stage` and `pieces`, which stride over their work) for the text length
/// in `text_len`.
fn group_count(
    grid: Grid,
    geometry: &Geometry,
    threads: u32,
    text_len: Expr,
    spread: Spread,
) -> Expr {
    match grid {
        // `stage` and `pieces` stride over their work, so any number of groups
        // covers it: in one workgroup one saves the others' clearing,
        // reductions and barriers; on a resident grid every workgroup takes a
        // share.
        Grid::Stage | Grid::PieceTiles => match spread {
            Spread::OneWorkgroup => Expr::u32(1),
            Spread::ResidentGrid => Expr::workgroup_count(Axis::X),
        },
        Grid::Merge => groups_of(
            (text_len + (MERGE_BYTES_PER_THREAD - 1)) / MERGE_BYTES_PER_THREAD,
            threads,
        ),
        Grid::PerChunk => groups_of(
            (text_len + (geometry.chunk_bytes - 1)) / geometry.chunk_bytes,
            threads,
        ),
        Grid::Compaction => {
            let blocks = groups_of(text_len, geometry.block_bytes());
            let per = groups_of(blocks.clone(), geometry.compact_workgroups);
            (blocks + (per.clone() - 1u32)) / per
        }
        Grid::Split => groups_of(text_len, geometry.split.block_bytes()),
    }
}

/// A step's workgroup buffers set to zero by every thread's strided share,
/// then a barrier; nothing when it has none.
fn clear_workgroup_buffers(buffers: &[BufferDecl], threads: u32) -> Vec<Node> {
    let mut nodes = Vec::new();
    for decl in buffers {
        let BufferCount::Static(count) = decl.count else {
            continue;
        };
        let element: Name = format!("{}_clear", decl.name).into();
        let at = Expr::Var(element.clone()) * threads + Expr::local_id(Axis::X);
        nodes.push(Node::Loop {
            variable: element,
            start: Expr::u32(0),
            end: Expr::u32(count.div_ceil(threads)),
            body: vec![Node::If {
                condition: at.clone().less_than(count),
                then_body: vec![Node::Store {
                    buffer: decl.name.clone(),
                    index: at,
                    value: zero_of(decl),
                }]
                .into(),
                else_body: Vec::new().into(),
            }]
            .into(),
        });
    }
    if !nodes.is_empty() {
        nodes.push(Node::Barrier);
    }
    nodes
}

/// A zero of `decl`'s element value type.
fn zero_of(decl: &BufferDecl) -> Expr {
    Expr::Literal(Literal::from_bits(decl.elem.value_type(), 0))
}

/// The rewrite of one step's body: its workgroup builtins from the group loop,
/// its buffers under their new names.
struct Rewrite<'a> {
    group: &'a Name,
    groups: &'a Name,
    threads: u32,
    rename: &'a BTreeMap<Name, Name>,
    spread: Spread,
}

impl Rebuild for Rewrite<'_> {
    type Error = String;

    fn buffer(&mut self, buffer: &Name) -> Name {
        self.rename
            .get(buffer)
            .cloned()
            .unwrap_or_else(|| buffer.clone())
    }

    fn node(&mut self, node: &Node) -> Result<Node, String> {
        match node {
            Node::GridSync => Err("a grid sync has no meaning in one workgroup".to_owned()),
            // A return would end the thread for every later group and step.
            Node::Return => Err("a step returns early".to_owned()),
            // In one workgroup every reader of a step's protocol (a status word,
            // a counter of finished groups) is in the writer's workgroup, so the
            // fence need not wait for the rest of the device.
            Node::Fence if self.spread == Spread::OneWorkgroup => Ok(Node::WorkgroupFence),
            _ => node.map_parts(self),
        }
    }

    fn expr(&mut self, expr: &Expr) -> Expr {
        match expr {
            Expr::Builtin(builtin) => self.builtin(*builtin),
            _ => expr.map_children(self),
        }
    }
}

impl Rewrite<'_> {
    fn builtin(&self, builtin: Builtin) -> Expr {
        match builtin {
            Builtin::WorkgroupId(Axis::X) => Expr::Var(self.group.clone()),
            Builtin::WorkgroupId(_) => Expr::u32(0),
            Builtin::WorkgroupCount(Axis::X) => Expr::Var(self.groups.clone()),
            Builtin::WorkgroupCount(_) => Expr::u32(1),
            Builtin::GlobalId(Axis::X) => Expr::binary(
                BinaryOp::Add,
                Expr::Var(self.group.clone()) * self.threads,
                Expr::local_id(Axis::X),
            ),
            Builtin::GlobalId(axis) => Expr::local_id(axis),
            Builtin::LocalId(_) | Builtin::Clock => Expr::Builtin(builtin),
        }
    }
}
