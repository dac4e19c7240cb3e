//! The prologue by which a kernel clears its workgroup memory, run thread by thread on
//! the host: every thread's stores, gathered over the workgroup, must cover each
//! workgroup buffer's bytes exactly (reads before writes see 0, as in the reference
//! interpreter), and none may land past a buffer or off a word.
//!
//! The prologue clears a buffer of a few strides (4 bytes a thread) with straight-line
//! stores, the last stride predicated on the thread's offset, and a larger one with a
//! loop; an off-by-one in either leaves a word of garbage that only a GPU run which
//! happens to find that word dirty would notice. This test runs without a GPU.

use std::collections::{BTreeSet, HashMap};

use vyre_cuda::codegen::program_to_ptx;
use vyre_cuda::ir::*;
use vyre_cuda::CodegenOptions;

/// A register's value in the prologue: a number, or a byte address in a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Value {
    Number(u64),
    Address { buffer: usize, offset: u64 },
}

/// A workgroup buffer as the PTX declares it: its symbol and its bytes.
struct Declared {
    symbol: String,
    bytes: u64,
}

/// The kernel's `.shared` declarations and the prologue's lines, from the zeroing
/// comment to the barrier that ends it, with the registers that hold each buffer's
/// address on entry.
struct Prologue {
    buffers: Vec<Declared>,
    bases: HashMap<String, Value>,
    lines: Vec<String>,
}

impl Prologue {
    fn parse(ptx: &str) -> Prologue {
        let buffers: Vec<Declared> = ptx
            .lines()
            .filter_map(|line| {
                let rest = line.trim().strip_prefix(".shared .align ")?;
                let (_, declaration) = rest.split_once(".b8 ")?;
                let (symbol, bytes) = declaration.strip_suffix("];")?.split_once('[')?;
                Some(Declared {
                    symbol: symbol.to_string(),
                    bytes: bytes.parse().ok()?,
                })
            })
            .collect();
        let start = ptx
            .find("// zero workgroup memory")
            .expect("a kernel with workgroup buffers clears them");
        let mut bases = HashMap::new();
        for line in ptx[..start].lines() {
            let Some(operands) = line.trim().strip_prefix("mov.u64 ") else {
                continue;
            };
            let (register, symbol) = operands
                .trim_end_matches(';')
                .split_once(", ")
                .expect("two operands");
            if let Some(buffer) = buffers.iter().position(|b| b.symbol == symbol) {
                bases.insert(register.to_string(), Value::Address { buffer, offset: 0 });
            }
        }
        let lines = ptx[start..]
            .lines()
            .skip(1)
            .map(str::trim)
            .take_while(|line| !line.starts_with("bar.sync") && !line.starts_with("barrier.sync"))
            .map(str::to_string)
            .collect();
        Prologue {
            buffers,
            bases,
            lines,
        }
    }

    /// The words each buffer's bytes hold that the workgroup's threads leave cleared,
    /// or the first store that lands past its buffer or off a word.
    fn cleared_words(&self, [x, y, z]: [u64; 3]) -> Result<Vec<BTreeSet<u64>>, String> {
        let mut cleared = vec![BTreeSet::new(); self.buffers.len()];
        for tid_z in 0..z {
            for tid_y in 0..y {
                for tid_x in 0..x {
                    for (buffer, offset) in self.run([tid_x, tid_y, tid_z])? {
                        let bytes = self.buffers[buffer].bytes;
                        if offset % 4 != 0 || offset + 4 > bytes {
                            return Err(format!(
                                "thread ({tid_x}, {tid_y}, {tid_z}) stores at byte {offset} of `{}`, {bytes} bytes",
                                self.buffers[buffer].symbol
                            ));
                        }
                        cleared[buffer].insert(offset / 4);
                    }
                }
            }
        }
        Ok(cleared)
    }

    /// One thread through the prologue: the (buffer, byte offset) of each store.
    fn run(&self, tid: [u64; 3]) -> Result<Vec<(usize, u64)>, String> {
        let labels: HashMap<&str, usize> = self
            .lines
            .iter()
            .enumerate()
            .filter_map(|(at, line)| Some((line.strip_suffix(':')?, at)))
            .collect();
        let mut registers = self.bases.clone();
        let mut stores = Vec::new();
        let mut at = 0;
        let mut steps = 0;
        while at < self.lines.len() {
            steps += 1;
            if steps > 1_000_000 {
                return Err("the prologue does not end".into());
            }
            let line = &self.lines[at];
            at += 1;
            if line.ends_with(':') {
                continue;
            }
            let (guard, instruction) = match line.strip_prefix('@') {
                Some(rest) => {
                    let (predicate, instruction) = rest.split_once(' ').expect("guarded");
                    (Some(predicate), instruction.trim())
                }
                None => (None, line.as_str()),
            };
            if let Some(predicate) = guard {
                if registers.get(predicate) != Some(&Value::Number(1)) {
                    continue;
                }
            }
            let (opcode, operands) = instruction
                .trim_end_matches(';')
                .split_once(' ')
                .unwrap_or((instruction, ""));
            let operands: Vec<&str> = operands.split(", ").map(str::trim).collect();
            let read = |operand: &str| -> Value {
                match operand {
                    "%tid.x" => Value::Number(tid[0]),
                    "%tid.y" => Value::Number(tid[1]),
                    "%tid.z" => Value::Number(tid[2]),
                    _ if operand.starts_with('%') => *registers
                        .get(operand)
                        .unwrap_or_else(|| panic!("`{operand}` read before it is set: {line}")),
                    _ => Value::Number(operand.parse().expect("an immediate")),
                }
            };
            let number = |operand: &str| match read(operand) {
                Value::Number(number) => number,
                Value::Address { .. } => panic!("an address where a number belongs: {line}"),
            };
            let value = match opcode {
                "mov.u32" => Some(read(operands[1])),
                "shl.b32" => Some(Value::Number(number(operands[1]) << number(operands[2]))),
                "mad.lo.u32" => Some(Value::Number(
                    number(operands[1]) * number(operands[2]) + number(operands[3]),
                )),
                "cvt.u64.u32" | "add.u32" | "add.s64" => {
                    let first = read(operands[1]);
                    let second = operands.get(2).map_or(0, |operand| number(operand));
                    Some(match first {
                        Value::Number(number) => Value::Number(number + second),
                        Value::Address { buffer, offset } => Value::Address {
                            buffer,
                            offset: offset + second,
                        },
                    })
                }
                "setp.lt.u32" => Some(Value::Number(u64::from(
                    number(operands[1]) < number(operands[2]),
                ))),
                "setp.ge.u32" => Some(Value::Number(u64::from(
                    number(operands[1]) >= number(operands[2]),
                ))),
                "st.shared.u32" => {
                    assert_eq!(operands[1], "0", "the prologue stores zeros: {line}");
                    let target = operands[0].trim_start_matches('[').trim_end_matches(']');
                    let (register, displacement) = match target.split_once('+') {
                        Some((register, displacement)) => (
                            register,
                            displacement.parse::<u64>().expect("a displacement"),
                        ),
                        None => (target, 0),
                    };
                    match read(register) {
                        Value::Address { buffer, offset } => {
                            stores.push((buffer, offset + displacement));
                        }
                        Value::Number(_) => panic!("a store through a number: {line}"),
                    }
                    None
                }
                "bra" => {
                    at = labels[operands[0]];
                    None
                }
                _ => panic!("an instruction this test does not know in the prologue: {line}"),
            };
            if let Some(value) = value {
                registers.insert(operands[0].to_string(), value);
            }
        }
        Ok(stores)
    }
}

/// `Ok` when the prologue of `ptx`, run by every thread of a `shape` workgroup, clears
/// each buffer's bytes exactly; the first defect otherwise.
fn check_clear(ptx: &str, shape: [u32; 3]) -> Result<(), String> {
    let prologue = Prologue::parse(ptx);
    let cleared = prologue.cleared_words(shape.map(u64::from))?;
    for (buffer, words) in prologue.buffers.iter().zip(&cleared) {
        let expected: BTreeSet<u64> = (0..buffer.bytes / 4).collect();
        if let Some(missing) = expected.difference(words).next() {
            return Err(format!(
                "word {missing} of `{}` ({} bytes) is never cleared",
                buffer.symbol, buffer.bytes
            ));
        }
    }
    Ok(())
}

/// A kernel of `shape` with workgroup buffers of these many `u32` words and a 10-byte
/// `u8` buffer (padded to 12), writing one output word per thread.
fn program(shape: [u32; 3], words: &[u32]) -> Program {
    let mut builder = Program::builder(shape).buffer(
        "out",
        0,
        Access::WriteOnly,
        ElemType::U32,
        BufferCount::Runtime,
    );
    for (index, &count) in words.iter().enumerate() {
        builder = builder.buffer(
            format!("words{index}"),
            index as u32 + 1,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(count),
        );
    }
    builder
        .buffer(
            "flags",
            words.len() as u32 + 1,
            Access::Workgroup,
            ElemType::U8,
            BufferCount::Static(10),
        )
        .body(|b| {
            b.store("out", Expr::local_id(Axis::X), 0u32);
        })
        .build()
}

/// The buffer lengths around a stride of `threads` words: one word, a few, one stride
/// less a word, a stride, a stride and a word, two strides and two words, and (where
/// the static 48 KiB hold it) 33 strides and a word, past the straight-line stores.
fn lengths(threads: u32) -> Vec<u32> {
    let mut words = vec![1, 3, threads, threads + 1, 2 * threads + 2];
    if threads > 1 {
        words.push(threads - 1);
    }
    if threads <= 256 {
        words.push(33 * threads + 1);
    }
    words
}

const SHAPES: [[u32; 3]; 6] = [
    [1, 1, 1],
    [32, 1, 1],
    [96, 1, 1],
    [256, 1, 1],
    [8, 4, 2],
    [1024, 1, 1],
];

/// Locks out workgroup memory left partly uncleared, or cleared past a buffer's end:
/// a predicated last stride that stops a word short or runs a word long, a loop whose
/// bound or stride drifts, a thread's offset that ignores the y and z axes of a 3-D
/// workgroup (each of the three, planted in the code generator, fails this test).
/// For six workgroup shapes (1, 32, 96, 256 and 1,024 threads, and 8 × 4 × 2), buffers
/// of 1, 3, a stride less one, a stride, a stride plus one, two strides plus two and 33
/// strides plus one words, and a padded `u8` buffer, every thread's run of the
/// prologue together clears every word, and no store lands outside its buffer.
/// Negative controls: the prologue with one predicated store removed leaves a word,
/// and with one predicate's bound a word higher stores past the buffer.
#[test]
fn workgroup_memory_is_cleared_exactly_by_every_workgroup_shape() {
    let options = CodegenOptions::new();
    for shape in SHAPES {
        let threads = shape.iter().product();
        let program = program(shape, &lengths(threads));
        let ptx = program_to_ptx(&program, &options, 90, 32).expect("generates");
        check_clear(&ptx, shape).unwrap_or_else(|defect| panic!("{shape:?}: {defect}"));
    }

    let shape = [96, 1, 1];
    let ptx = program_to_ptx(&program(shape, &lengths(96)), &options, 90, 32).expect("ptx");
    let predicated_store = ptx
        .lines()
        .find(|line| line.trim().starts_with("@%p") && line.contains("st.shared.u32"))
        .expect("a predicated last stride");
    let without_store = ptx.replacen(&format!("{predicated_store}\n"), "", 1);
    let defect = check_clear(&without_store, shape).expect_err("a store removed");
    assert!(defect.contains("is never cleared"), "{defect}");

    let bound = ptx
        .lines()
        .find(|line| line.trim().starts_with("setp.lt.u32"))
        .expect("a predicate's bound");
    let (head, limit) = bound
        .trim_end_matches(';')
        .rsplit_once(", ")
        .expect("bound");
    let limit: u32 = limit.parse().expect("an immediate bound");
    let raised = ptx.replacen(bound, &format!("{head}, {};", limit + 4), 1);
    let defect = check_clear(&raised, shape).expect_err("a bound a word high");
    assert!(defect.contains("stores at byte"), "{defect}");
}
