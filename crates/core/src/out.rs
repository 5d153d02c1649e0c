//! What the command-line tools print. A reader that stops reading (`| head`) ends the output,
//! not the command with a panic as `println!` would (Rust ignores SIGPIPE, as the components
//! need: they write to sockets): the command exits at once, quietly, with status 0. A message
//! that cannot reach stderr is dropped, with nowhere to tell it. Printing goes through
//! [`outln!`](crate::outln), [`out!`](crate::out) and [`errln!`](crate::errln), never `println!`
//! or `eprintln!`.
use std::io::Write;

/// Writes `args` to stdout, or ends the process if it cannot be written.
pub fn print(args: std::fmt::Arguments) {
    let Err(e) = std::io::stdout().lock().write_fmt(args) else {
        return;
    };
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    let _ = writeln!(std::io::stderr(), "splitos: cannot write the output: {e}");
    std::process::exit(1);
}

/// Writes `args` to stderr, if it can.
pub fn eprint(args: std::fmt::Arguments) {
    let _ = std::io::stderr().lock().write_fmt(args);
}

/// `print!` to stdout that ends the process quietly when the reader is gone ([`print`]).
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => { $crate::out::print(format_args!($($arg)*)) };
}

/// `println!` to stdout that ends the process quietly when the reader is gone ([`print`]).
#[macro_export]
macro_rules! outln {
    () => { $crate::out::print(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::out::print(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `eprintln!` that drops a line stderr no longer takes ([`eprint`]).
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => { $crate::out::eprint(format_args!("{}\n", format_args!($($arg)*))) };
}
