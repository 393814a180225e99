package snippet

// How code reaches the interpreter.
//
// Both interpreters get a pipe as file descriptor 3, the "gate". The agent
// starts the interpreter, sets the request's rlimits on it (Go cannot set
// rlimits between fork and exec), and only then writes to the gate. Each
// interpreter reads the gate to its end and closes it before running any of
// the snippet's code, so limits always apply before the first line of the
// snippet runs, and no descendant of the snippet inherits the gate.
//
// Python reads its code from the gate. The code is never written to disk:
// a call works when /tmp is full or read-only and leaves nothing behind if
// the agent dies. A small bootstrap, passed with -c, compiles the code under
// the name "<snippet>" and runs it in __main__, so that the snippet behaves as
// under python3 -c (sys.path[0] is '', the working directory, so modules left
// in /tmp by earlier calls import) and a traceback reads:
//
//	Traceback (most recent call last):
//	  File "<snippet>", line 3, in <module>
//	    print(1 / 0)
//	          ~~^~~
//	ZeroDivisionError: division by zero
//
// without the bootstrap's own frames, and with the source line, which
// python3 -c and python3 - never show. The source lines come from linecache,
// seeded only when something imports linecache (the traceback printer, the
// warnings printer, inspect, pdb): importing it up front would add 5 ms to
// every call. Uncaught exceptions in threads are printed by CPython's C code,
// which reads source lines only from files, so they show "<snippet>" and the
// line number without the line. SystemExit and KeyboardInterrupt keep their
// usual exit statuses.
//
// Shell code is passed as sh -c CODE, prefixed on its first line with the
// read of the gate, so that line numbers in error messages are unchanged.

// gateFD is the descriptor number of the gate in the interpreter.
const gateFD = 3

// snippetFilename is the file name of Python snippets in tracebacks.
const snippetFilename = "<snippet>"

// pythonBootstrap is the program that python3 -c runs. Its own frames are
// those of file "<string>"; they are dropped from the snippet's tracebacks.
// Nothing it defines stays in __main__.
const pythonBootstrap = `def _flmbox_bootstrap():
    import sys
    main = sys.modules['__main__']
    del main._flmbox_bootstrap
    with open(3, 'rb') as gate:
        source = gate.read()
    name = '<snippet>'

    def seed(linecache):
        lines = source.decode('utf-8-sig', 'replace').splitlines(True)
        linecache.cache[name] = (len(source), None, lines, name)

    class SeedLinecache:
        @staticmethod
        def find_spec(fullname, path=None, target=None):
            if fullname != 'linecache':
                return None
            try:
                sys.meta_path.remove(SeedLinecache)
            except ValueError:
                pass
            for finder in sys.meta_path:
                find = getattr(finder, 'find_spec', None)
                spec = find and find(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
            exec_module = spec.loader.exec_module

            def exec_and_seed(module):
                exec_module(module)
                seed(module)
            try:
                spec.loader.exec_module = exec_and_seed
            except AttributeError:
                pass
            return spec

    if 'linecache' in sys.modules:
        seed(sys.modules['linecache'])
    else:
        sys.meta_path.insert(0, SeedLinecache)
    try:
        exec(compile(source, name, 'exec'), main.__dict__)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as e:
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == '<string>':
            tb = tb.tb_next
        e.__traceback__ = tb
        if sys.excepthook is sys.__excepthook__:
            import traceback
            traceback.print_exception(type(e), e, tb)
        else:
            sys.excepthook(type(e), e, tb)
        raise SystemExit(1)
_flmbox_bootstrap()
`

// shellPrologue reads and closes the gate; it shares the first line of the
// snippet's code.
const shellPrologue = "read -r _ <&3;exec 3<&-;"

// command is how one request is run: the interpreter's arguments and what
// goes through the gate.
type command struct {
	args []string // argv, argv[0] included
	gate []byte   // written to the gate once limits are set
}

// pythonCommand runs code with the bootstrap; the code goes through the gate.
func pythonCommand(code string) command {
	return command{args: []string{"python3", "-c", pythonBootstrap}, gate: []byte(code)}
}

// shellCommand runs code with sh -c; the gate carries a newline.
func shellCommand(code string) command {
	return command{args: []string{"sh", "-c", shellPrologue + code}, gate: []byte("\n")}
}
