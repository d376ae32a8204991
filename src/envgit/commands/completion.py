"""`envgit completion bash|zsh|fish`: a shell completion script, printed, for the person to
source (`source <(envgit completion bash)`, or saved where the shell loads completions).

The script is static: the commands, their subcommands and options are read from the parser tree
once, when it is printed, so completing a word runs no Python (the hot path stays as it is).
After `run` and the agents' names, the words are the command's own: bash and zsh complete
commands and files there, fish its own defaults.
"""

import argparse

from . import command

SHELLS = ("bash", "zsh", "fish")
# Whose arguments after their name are not envgit's (cli.py dispatches them before argparse).
OWN_ARGS = ("run", "claude", "codex", "copilot")


def add_parsers(sub, argparse_module):
    s = command(sub, "completion", help="print a shell completion script for bash, zsh or fish",
                example=["source <(envgit completion bash)      # in ~/.bashrc",
                         "envgit completion zsh > \"${fpath[1]}/_envgit\"",
                         "envgit completion fish > ~/.config/fish/completions/envgit.fish"])
    s.add_argument("shell", choices=SHELLS, help="the shell the script is for")
    s.set_defaults(fn=cmd_completion)


def cmd_completion(args):
    words = tree(args.parser_root)
    print({"bash": bash, "zsh": zsh, "fish": fish}[args.shell](words), end="")
    return 0


def _subparsers(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def tree(parser, path=()):
    """{command path (a tuple of words): the words that may follow it}: the subcommands, then the
    long and short options, of every parser under `parser`."""
    out = {}
    subs = _subparsers(parser)
    names = sorted(subs.choices) if subs else []
    options = sorted(o for a in parser._actions for o in a.option_strings)
    out[path] = names + options
    if subs:
        for name in names:
            if path == () and name in OWN_ARGS:
                out[(name,)] = []
                continue
            out.update(tree(subs.choices[name], path + (name,)))
    return out


def _key(path):
    return " ".join(("envgit",) + path)      # bash allows no empty key in an associative array


def bash(words):
    table = "\n".join(f'    ["{_key(p)}"]="{" ".join(w)}"' for p, w in sorted(words.items()))
    own = " ".join(OWN_ARGS)
    return f"""# envgit completion for bash (envgit completion bash)
declare -gA _envgit_words=(
{table}
)
_envgit() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} key=envgit at=0 next w i
    for ((i = 1; i < COMP_CWORD; i++)); do
        w=${{COMP_WORDS[i]}}
        [ "$at" -gt 0 ] && break            # past run or an agent: the words are its own
        [[ $w == -* ]] && continue
        next="$key $w"                      # (a variable: zsh keeps quotes in a subscript)
        if [[ -n ${{_envgit_words[$next]+x}} ]]; then
            key=$next
            case " {own} " in *" ${{key#envgit }} "*) at=$i;; esac
        fi
    done
    if [ "$at" -gt 0 ]; then
        # the command run: a command name first, then its arguments (files, by -o default)
        COMPREPLY=()
        if [ $((at + 1)) -eq "$COMP_CWORD" ] && [ "$key" = "envgit run" ]; then
            COMPREPLY=($(compgen -c -- "$cur"))
        fi
        return 0
    fi
    # (zsh's compgen leaves the filtering by the word typed to zsh's completion system)
    COMPREPLY=($(compgen -W "${{_envgit_words[$key]}}" -- "$cur"))
}}
complete -o default -o bashdefault -F _envgit envgit
"""


def zsh(words):
    # zsh runs bash's completion functions through bashcompinit, zsh's own compatibility layer
    return ("#compdef envgit\n# envgit completion for zsh (envgit completion zsh)\n"
            "(( $+functions[compdef] )) || { autoload -U +X compinit && compinit -u; }\n"
            "autoload -U +X bashcompinit && bashcompinit\n" + bash(words).split("\n", 1)[1])


def fish(words):
    lines = ["# envgit completion for fish (envgit completion fish)", "complete -c envgit -f"]
    for path, follow in sorted(words.items()):
        subs = [w for w in follow if not w.startswith("-")]
        opts = [w for w in follow if w.startswith("-")]
        if not path:
            cond = "__fish_use_subcommand"
        else:
            cond = " ; and ".join(f"__fish_seen_subcommand_from {w}" for w in path)
            children = [k[-1] for k in words if len(k) == len(path) + 1 and k[:-1] == path]
            if children:
                cond += " ; and not __fish_seen_subcommand_from " + " ".join(children)
        if path and path[0] in OWN_ARGS:
            lines.append(f"complete -c envgit -n '{cond}' -F")       # the command's own words: files
            continue
        if subs:
            lines.append(f"complete -c envgit -n '{cond}' -a '{' '.join(subs)}'")
        for o in opts:
            flag = f"-l {o[2:]}" if o.startswith("--") else f"-s {o[1:]}"
            lines.append(f"complete -c envgit -n '{cond}' {flag}")
    return "\n".join(lines) + "\n"
