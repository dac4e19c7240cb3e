//! `without`: a block with every statement a predicate picks removed, at any
//! depth. Negative controls use it to build the program a guard must reject
//! (a protocol without its fences). Include it with
//! `#[path = "support/without.rs"] mod without;` (from the tokenizer's tests,
//! `"../../tests/support/without.rs"`).
#![allow(dead_code)]

use vyre_cuda::ir::Node;

/// `block` without the statements `drop` picks, inside `if`s and loops too.
pub fn without(block: &[Node], drop: &dyn Fn(&Node) -> bool) -> Vec<Node> {
    block
        .iter()
        .filter(|node| !drop(node))
        .map(|node| match node {
            Node::If {
                condition,
                then_body,
                else_body,
            } => Node::If {
                condition: condition.clone(),
                then_body: without(then_body, drop).into(),
                else_body: without(else_body, drop).into(),
            },
            Node::Loop {
                variable,
                start,
                end,
                body,
            } => Node::Loop {
                variable: variable.clone(),
                start: start.clone(),
                end: end.clone(),
                body: without(body, drop).into(),
            },
            Node::While { condition, body } => Node::While {
                condition: condition.clone(),
                body: without(body, drop).into(),
            },
            other => other.clone(),
        })
        .collect()
}
