fn main() -> std::process::ExitCode {
    ctxpod::cli::main()
}
