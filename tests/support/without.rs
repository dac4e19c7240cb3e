//! `without`: a block with every statement a predicate picks removed, at any
//! depth. Negative controls use it to build the program a guard must reject
//! (a protocol without its fences). Include it with
//! `#[path = "support/without.rs"] mod without;` (from the tokenizer's tests,
//! `"../../tests/support/without.rs"`).
#![allow(dead_code)]

use std::convert::Infallible;

use vyre_cuda::ir::{Block, Node, Rebuild};

/// `block` without the statements `drop` picks, inside `if`s and loops too.
pub fn without(block: &Block, drop: &dyn Fn(&Node) -> bool) -> Vec<Node> {
    let Ok(kept) = Without(drop).block(block);
    kept.to_vec()
}

/// The rebuild that leaves out what its predicate picks.
struct Without<'a>(&'a dyn Fn(&Node) -> bool);

impl Rebuild for Without<'_> {
    type Error = Infallible;

    fn block(&mut self, block: &Block) -> Result<Block, Infallible> {
        let drop = self.0;
        block
            .iter()
            .filter(|node| !drop(node))
            .map(|node| node.map_parts(self))
            .collect()
    }
}
