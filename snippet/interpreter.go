package snippet

import "strings"

// How code reaches the interpreter.
//
// Every interpreter gets a pipe, the "gate": file descriptor 3, or stdin for
// sh -s. The agent starts the interpreter, sets the request's rlimits on it
// (Go cannot set rlimits between fork and exec), and only then writes to the
// gate. Each interpreter reads the gate to its end and closes it before
// running any of the snippet's code, so limits always apply before the first
// line of the snippet runs, and no descendant of the snippet inherits the
// gate.
//
// Python reads its code from the gate. Unless the call asks for a file
// (Request.File: see writeCode and shellRunFile), the code is never written
// to disk: a call works when /tmp is full or read-only and leaves nothing
// behind if the agent dies. A small bootstrap, passed with -c, compiles the code under
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
// warnings printer, inspect, pdb): importing it up front would slow every
// call (docs/PERFORMANCE.md, "Spares and the zygote"). Uncaught exceptions
// in threads are printed by CPython's C code, which reads source lines only
// from files, so they show "<snippet>" and the line number without the
// line. SystemExit and KeyboardInterrupt keep their usual exit statuses.
//
// Shell code of at most maxShellScript bytes, when /bin/sh is dash, runs as
// sh -s, which reads it from the gate (shellScriptCommand); other shell code
// is passed as sh -c CODE, prefixed on its first line with the read of the
// gate (shellPrologue), so that line numbers in error messages are unchanged.

// gateFD is the descriptor number of the gate in the interpreter.
const gateFD = 3

// snippetFilename is the file name of Python snippets in tracebacks.
const snippetFilename = "<snippet>"

// pythonBootstrap returns the program that python3 -c runs, whose
// snippet runs as user (nil: the interpreter's own; see user_linux.go) and
// leaves with the bootstrap's fast exit if fastExit is set. Its own frames
// are those of file "<string>"; they are dropped from the snippet's
// tracebacks. Nothing it defines stays in __main__.
func pythonBootstrap(user *User, fastExit bool) string {
	return pythonSiteDef + "_flmbox_front = _flmbox_site(())\n" + pythonBootstrapDef +
		"_flmbox_bootstrap(" + pyBool(fastExit) + ", _flmbox_front, " + user.python() + ")\n"
}

func pyBool(b bool) string {
	if b {
		return "True"
	}
	return "False"
}

// pythonSiteDef defines _flmbox_site(modules), which imports modules with
// sys.path cut to what the interpreter's start made it: the standard library
// and the image's site directories, without the empty entry (the working
// directory, /tmp) that python3 -c puts first, and returns the snippets'
// directories, which the bootstrap puts back in front of sys.path once the
// process is the snippet's user.
//
// Every Python process the agent starts runs as python3 does, with the
// site module imported at its start (sys.flags.no_site and no_user_site are
// 0, so the Pythons a snippet starts, multiprocessing's spawn and forkserver
// workers and resource trackers among them, run with the image's defaults
// too), but the agent starts it with an environment in which no file that
// snippets can write takes part in that start (see pythonEnv): PYTHONPATH
// is renamed FLMBOX_PYTHONPATH (the encodings module is imported from
// sys.path before any -c code runs, and site would look for sitecustomize
// and usercustomize there), and PYTHONUSERBASE names noUserBase, a directory
// that nobody can make, so that site finds no user site (its .pth files,
// usercustomize) under HOME=/tmp. Such files would otherwise run at the start
// of the next spare, as the agent's user and before its limits are set, and
// in a zygote, which has none: a snippet could plant a fork bomb there and
// kill the zygote to have it run. The bootstrap puts both variables back
// once the process is the snippet's user, then does what site does for the
// user site (pythonUserSiteDef), and puts the snippets' directories in front
// of sys.path where python3 puts them (the empty entry, unless
// PYTHONSAFEPATH, then PYTHONPATH's entries made absolute, an empty one
// being the working directory).
//
// The difference from python3 -c that a snippet can see: a sitecustomize
// found only through PYTHONPATH is not run, even one of the image's own
// (PYTHONPATH=/app, say); the image's site directories' one is.
const pythonSiteDef = `def _flmbox_site(modules):
    import sys, os
    # sys.path is '' (python3 -c's working directory) unless PYTHONSAFEPATH,
    # then the standard library and the image's site directories.
    front = sys.path[:1] if sys.path[:1] == [''] else []
    del sys.path[:len(front)]
    for m in modules:
        __import__(m)
    pp = os.environ.get('FLMBOX_PYTHONPATH')
    if pp is not None:
        front += [os.path.abspath(p) for p in pp.split(os.pathsep)]
    del sys.modules['__main__']._flmbox_site
    return front
`

// pythonUserSiteDef is the part of the bootstrap that, once the process is
// the snippet's user and its environment is back, does what site does at a
// python3's start for the user site: it finds it again (site.USER_BASE and
// USER_SITE, from PYTHONUSERBASE or HOME), and if it is a directory puts it
// on sys.path where python3 has it, before the image's site directories,
// with its .pth files processed; then it imports usercustomize, as site
// does, with PYTHONPATH's entries on sys.path but not yet the working
// directory, if it is in a directory that site did not look in at the
// start (looking all over sys.path again costs every call measurably under
// gVisor: docs/PERFORMANCE.md).
const pythonUserSiteDef = `    ub = os.environ.pop('FLMBOX_PYTHONUSERBASE', None)
    if ub is None:
        os.environ.pop('PYTHONUSERBASE', None)
    else:
        os.environ['PYTHONUSERBASE'] = ub
    site = sys.modules.get('site')
    if site is not None and site.ENABLE_USER_SITE:
        site.USER_BASE = site.USER_SITE = None
        user_site = site.getusersitepackages()
        new = front[cwd:]
        if os.path.isdir(user_site):
            system = set(site.getsitepackages())
            i = next((i for i, p in enumerate(sys.path) if p in system), len(sys.path))
            rest = sys.path[i:]
            del sys.path[i:]
            site.addsitedir(user_site)
            new += sys.path[i:]
            sys.path += [p for p in rest if p not in sys.path]
        # site looked for usercustomize at the start, in the image's
        # directories: look where it did not.
        finder = next((f for f in sys.meta_path if getattr(f, '__name__', None) == 'PathFinder'), None)
        if new and 'usercustomize' not in sys.modules and finder and finder.find_spec('usercustomize', new):
            site.execusercustomize()
`

// pythonBootstrapDef defines the bootstrap. With fast_exit (a zygote's child,
// see pythonZygote, and a process of the agent's own python3), once the
// snippet ends it does what the interpreter's exit does that a program can
// see, and leaves with os._exit: the interpreter's teardown would touch, and
// so copy, much of the memory a child shares with the zygote
// (docs/PERFORMANCE.md, "Spares and the zygote"), and in a python3 under
// gVisor it takes milliseconds of the call (the first call of a new
// sandbox waits for it, a python3 spare's). Another interpreter
// (Request.Interpreter) exits as usual. What it keeps:
// the exit status of SystemExit (a message printed, 1), a traceback and 1 for
// an exception, non-daemon threads joined, atexit functions run, the snippet's
// globals and garbage freed (their __del__ methods run: files held by them are
// closed), every file object still open flushed, stdout and stderr flushed
// (120 if that fails, as Python does). What it skips is what Python does not
// promise: __del__ of objects still alive elsewhere (in other modules) at
// exit.
const pythonBootstrapDef = `def _flmbox_bootstrap(fast_exit, front, user):
    import sys, os
    main = sys.modules['__main__']
    del main._flmbox_bootstrap, main._flmbox_front
    with open(3, 'rb') as gate:
        source = gate.read()
    # The call's own settings (a callback socket's path): NAME=VALUE\0...,
    # then \0, before the code; =PATH names the code's file (Request.File).
    end = source.index(b'\0')
    file = None
    while end:
        name, _, value = source[:end].partition(b'=')
        if name:
            os.environb[name] = value
        else:
            file = os.fsdecode(value)
        source = source[end + 1:]
        end = source.index(b'\0')
    source = source[1:]
    if user is not None:
        try:
            os.setgroups([])
            os.setgid(user[1])
            os.setuid(user[0])
        except OSError as e:
            os.write(2, b'flmbox: run the snippet as user %d: %s\n' % (user[0], str(e).encode()))
            os._exit(125)
    pp = os.environ.pop('FLMBOX_PYTHONPATH', None)
    if pp is not None:
        os.environ['PYTHONPATH'] = pp
    cwd = front[:1] == ['']
    sys.path[:0] = front[cwd:]
` + pythonUserSiteDef + `    sys.path[:0] = front[:cwd]
    # A spare started before an earlier call made a directory of sys.path
    # (/tmp/site-packages) remembers it as missing, as does the look for
    # usercustomize: forget that, so that the code can make it and import.
    for path, finder in list(sys.path_importer_cache.items()):
        if finder is None:
            del sys.path_importer_cache[path]
    name = '<snippet>'
    if file is not None:
        # As python3 FILE: __file__ and sys.argv[0] name it.
        name = main.__file__ = sys.argv[0] = file
        main.__cached__ = None

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
    status = 0
    try:
        exec(compile(source, name, 'exec'), main.__dict__)
    except KeyboardInterrupt:
        raise
    except SystemExit as e:
        if not fast_exit:
            raise
        status = e.code
        if status is None:
            status = 0
        elif not isinstance(status, int):
            try:
                print(status, file=sys.stderr)
            except BaseException:
                pass
            status = 1
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
        if not fast_exit:
            raise SystemExit(1)
        status = 1
    if not fast_exit:
        return
    import atexit, gc, os, _io
    try:
        threading = sys.modules.get('threading')
        if threading is not None:
            threading._shutdown()
    except BaseException:
        pass
    atexit._run_exitfuncs()
    for k in [k for k in main.__dict__ if not k.startswith('__')]:
        del main.__dict__[k]
    gc.collect()
    for obj in gc.get_objects():
        try:
            if isinstance(obj, _io._IOBase) and not obj.closed:
                obj.flush()
        except BaseException:
            pass
    for f in (sys.stdout, sys.stderr):
        try:
            if f is not None and not getattr(f, 'closed', False):
                f.flush()
        except BaseException:
            status = 120
    os._exit(status & 0xff if -2**31 <= status < 2**31 else 255)
`

// shellPrologue reads and closes the gate; it shares the first line of the
// snippet's code.
const shellPrologue = "read -r _ <&3;exec 3<&-;"

// maxShellScript is the largest shell code run as sh -s, the code read from
// stdin: a write of at most PIPE_BUF bytes reaches the pipe at once, so the
// shell's first read takes the whole code and its commands find stdin at
// EOF, as with /dev/null. Larger code runs as sh -c.
const maxShellScript = 4096

// pythonZygote is the program of the Python zygote: an interpreter started
// once, which forks a snippet's process on each request of the agent, much
// faster than starting python3 (see zygote_linux.go). It reads requests on
// the socket at fd 3: "F ID MEMORY PROCS FILEBYTES" with three descriptors
// (stdout, stderr, gate) or four (and stdin), answers "P ID PID" or "E ID
// ERROR", and reports "X PID STATUS" once a child it forked has exited; it
// keeps the child a zombie, so that its process group's ID stays its own,
// until the agent has killed the rest of the group and says "R PID" (see
// proc.linger), and reaps it then. A child it did not fork (a snippet can
// give it one with clone(CLONE_PARENT)) it reports once it has killed the
// child's group and reaped it. It exits when the agent closes the socket. A child returns from _flmbox_zygote with its stdio and gate in
// place, in its own process group, with its limits set, and goes on with the
// bootstrap, as python3 -c pythonBootstrap would. Its modules are imported
// by _flmbox_site, from the standard library only: what the zygote imports
// runs unlimited and lives on in every child.
func pythonZygote(user *User) string {
	return pythonSiteDef + "_flmbox_front = _flmbox_site(('gc', 'select', 'resource', '_signal', '_socket'))\n" +
		pythonZygoteDef + pythonBootstrapDef + "_flmbox_bootstrap(True, _flmbox_front, " + user.python() + ")\n"
}

const pythonZygoteDef = `def _flmbox_zygote():
    import sys, gc, os, select, resource, _signal, _socket
    del sys.modules['__main__']._flmbox_zygote
    ctl = _socket.socket(fileno=3)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    _signal.signal(_signal.SIGCHLD, lambda signum, frame: None)
    _signal.set_wakeup_fd(wake_w)
    poll = select.poll()
    poll.register(3, select.POLLIN)
    poll.register(wake_r, select.POLLIN)
    limits = (resource.RLIMIT_NPROC, resource.RLIMIT_FSIZE)
    kids, zombies = set(), set()

    def status(info):
        if info.si_code == os.CLD_EXITED:
            return (info.si_status & 0xff) << 8
        return info.si_status & 0x7f | (0x80 if info.si_code == os.CLD_DUMPED else 0)

    def send(msg):
        try:
            ctl.send(msg)
        except OSError:  # the agent is gone
            os._exit(0)
    gc.freeze()
    while True:
        for fd, _ in poll.poll():
            if fd == wake_r:
                try:
                    while os.read(wake_r, 64):
                        pass
                except BlockingIOError:
                    pass
                # A child it forked for a request is reported at once and
                # kept a zombie, so that its process group's ID stays its
                # own, until the agent has killed the group (R PID).
                for pid in list(kids):
                    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                    if info is not None:
                        kids.discard(pid)
                        zombies.add(pid)
                        send(b'X %d %d' % (pid, status(info)))
                # Others: children a snippet gave it (clone with CLONE_PARENT).
                while True:
                    try:
                        info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                    except ChildProcessError:
                        break
                    if info is None or info.si_pid in kids or info.si_pid in zombies:
                        break
                    try:
                        os.killpg(info.si_pid, 9)
                    except OSError:
                        pass
                    pid, st = os.waitpid(info.si_pid, 0)
                    send(b'X %d %d' % (pid, st))
                continue
            try:
                msg, anc, _, _ = ctl.recvmsg(256, _socket.CMSG_SPACE(16))
            except OSError:
                msg = b''
            if not msg:
                os._exit(0)
            fds = []
            for level, kind, data in anc:
                if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                    fds += [int.from_bytes(data[i:i + 4], sys.byteorder) for i in range(0, len(data) - 3, 4)]
            word = msg.split()
            if word[:1] == [b'R'] and not fds:
                try:
                    pid = int(word[1])
                    zombies.remove(pid)
                except (IndexError, ValueError, KeyError):
                    continue
                try:
                    os.killpg(pid, 9)
                except OSError:
                    pass
                os.waitpid(pid, 0)
                continue
            try:
                if len(fds) not in (3, 4) or len(word) != 4:
                    raise ValueError('bad request %r with %d descriptors' % (msg, len(fds)))
                values = [int(w) for w in word[2:]]
                pid = os.fork()
            except Exception as e:
                for f in fds:
                    os.close(f)
                send(b'E %s %s' % (word[1] if len(word) > 1 else b'0', str(e).encode()))
                continue
            if pid == 0:
                _signal.set_wakeup_fd(-1)
                _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
                ctl.detach()
                os.setpgid(0, 0)
                for src, dst in zip(fds, (1, 2, 3, 0)):
                    os.dup2(src, dst)
                for f in fds + [wake_r, wake_w]:
                    os.close(f)
                try:
                    for kind, value in zip(limits, values):
                        if value > 0:
                            hard = resource.getrlimit(kind)[1]
                            if hard != resource.RLIM_INFINITY:
                                value = min(value, hard)
                            resource.setrlimit(kind, (value, value))
                except Exception as e:
                    os.write(2, b'flmbox: set the snippet limits: %s\n' % str(e).encode())
                    os._exit(125)
                return
            for f in fds:
                os.close(f)
            try:
                os.setpgid(pid, pid)
            except OSError:
                pass
            kids.add(pid)
            send(b'P %s %d' % (word[1], pid))
_flmbox_zygote()
`

// command is how an interpreter is started; its code goes through the gate
// once its limits are set.
type command struct {
	args []string // argv, argv[0] included
	// codeInGate: the gate carries the code (python3, sh -s); otherwise the
	// code is in args and the gate carries a newline (sh -c).
	codeInGate bool
	// stdinGate: the gate is stdin (sh -s), not fd 3.
	stdinGate bool
	// envHeader: the gate carries the call's env settings before the code
	// (Python's bootstrap).
	envHeader bool
}

// gateData is what goes through c's gate for code, with the call's env
// settings for a Python process (a shell's are in its code: shellExports).
func (c command) gateData(code string, env []string) []byte {
	if !c.codeInGate {
		return []byte("\n")
	}
	if !c.envHeader {
		return []byte(code)
	}
	var b []byte
	for _, kv := range env {
		b = append(append(b, kv...), 0)
	}
	return append(append(b, 0), code...)
}

// shellExports is shell code, without a newline, that exports env's
// settings: put before a snippet's first line, it leaves its line numbers
// as they were. env's names are shell identifiers.
func shellExports(env []string) string {
	var b strings.Builder
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		b.WriteString("export " + name + "=" + shellQuote(value) + ";")
	}
	return b.String()
}

// pythonCommand runs code with the bootstrap; the code goes through the gate.
// The snippet's own stdout and stderr are unbuffered (-u), so that what it
// printed before a timeout or the memory watch killed it is in the result;
// unlike PYTHONUNBUFFERED, -u does not reach the Pythons it starts
// (subprocess._args_from_interpreter_flags leaves it out), which run with the
// image's defaults: no other option is given (see pythonSiteDef).
// fastExit: the bootstrap's (see pythonBootstrapDef).
func pythonCommand(user *User, fastExit bool) command {
	return command{args: []string{"python3", "-u", "-c", pythonBootstrap(user, fastExit)}, codeInGate: true, envHeader: true}
}

// zygoteCommand starts the Python zygote; its children's stdout and stderr
// are unbuffered, as pythonCommand's.
func zygoteCommand(user *User) command {
	return command{args: []string{"python3", "-u", "-c", pythonZygote(user)}}
}

// shellCommand runs code with sh -c; the gate carries a newline.
func shellCommand(code string) command {
	return command{args: []string{"sh", "-c", shellPrologue + code}}
}

// shellRunFile is the shell code that runs a call's code file with the
// shell at path, as path FILE does: the agent's shell (a spare, or one
// started for the call, its limits set and its gate read) execs path FILE.
// So $0, line numbers and error messages are FILE's, whatever the shell
// (csh and fish too: the agent's sh reads this line, not path), and
// sourcing FILE would have added the agent's shell's name to every error
// message.
func shellRunFile(path, file string) string {
	return "exec " + shellQuote(path) + " " + shellQuote(file)
}

// shellQuote quotes s for the shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// shellScriptCommand starts sh -s, which reads its code from stdin, the gate.
// Only code of at most maxShellScript bytes may go through its gate.
func shellScriptCommand() command {
	return command{args: []string{"sh", "-s"}, codeInGate: true, stdinGate: true}
}
