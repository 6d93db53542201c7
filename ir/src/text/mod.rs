//! The `.tir` text form: lexer, parser and canonical printer.
