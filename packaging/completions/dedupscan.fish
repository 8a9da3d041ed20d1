# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_dedupscan_global_optspecs
    string join \n incremental rehash block-size= threads= exclude= exclude-from= include-readonly-snapshots include-nocow share-across-owners drop-cache max-runtime= metrics-file= n/dry-run min-range= rewrite-ratio= keep-free= share-snapshotted keep-zeros list full-plan-days= db= json v/verbose q/quiet log-level= progress= h/help V/version
end

function __fish_dedupscan_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_dedupscan_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_dedupscan_using_subcommand
    set -l cmd (__fish_dedupscan_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c dedupscan -n "__fish_dedupscan_needs_command" -l block-size -d 'Block size for fingerprints: a power of two from 4K to 1M (suffixes K, M). At least the filesystem\'s own block size: XFS made with 16K or 64K blocks shares whole blocks of that size only, so those are used' -r -f
complete -c dedupscan -n "__fish_dedupscan_needs_command" -l threads -d 'Hashing threads [default: 8 per CPU, 8 to 64: most wait on the disk]' -r -f
complete -c dedupscan -n "__fish_dedupscan_needs_command" -l exclude -d 'Leave out paths matching this glob (repeatable; matched on the full path, so it starts with \'/\' or \'*\', e.g. \'**/*.qcow2\' or \'/srv/tmp/**\'). A glob that matches nothing is warned about' -r -f
complete -c dedupscan -n "__fish_dedupscan_needs_command" -l exclude-from -d 'Read more exclude globs from FILE, one per line (\'#\' starts a comment)' -r -F
complete -c dedupscan -n "__fish_dedupscan_needs_command" -l max-runtime -d 'Stop cleanly when this much time is spent (e.g. 90m, 2h); work done is committed, the exit status is 5 and the next run carries on' -r -f
complete -c dedupscan -n "__fish_dedupscan_needs_command" -l metrics-file -d 'After the run, write its figures in the Prometheus text format to this file (replaced atomically), e.g. for node_exporter\'s textfile collector: /var/lib/prometheus/node-exporter/dedupscan-srv.prom' -r -F
complete -c dedupscan -n "__fish_dedupscan_needs_command" -l min-range -d 'Shortest range worth sharing, in bytes (rounded down to blocks; whole small files are always shared)' -r -f
complete -c dedupscan -n "__fish_dedupscan_needs_command" -l rewrite-ratio -d 'btrfs: where a destination extent is only partly shared, copy its remainder into a fresh extent so the old one is freed — when the remainder is at most RATIO times the shared part (so at most RATIO bytes are copied for each byte freed). 0 turns it off. Where bytes stay pinned below RATIO, the run\'s report says what each of 2, 4, 8 and 16 above RATIO would free and copy' -r -f
complete -c dedupscan -n "__fish_dedupscan_needs_command" -l keep-free -d 'btrfs: rewrite (see --rewrite-ratio) only while the volume keeps at least this much free: a size (e.g. 20G) or a share of the volume (e.g. 2%). The copies hold space until the old extents are released at the next commit, and other programs write meanwhile; a file whose rest would go below waits: tried again in the room the run\'s sharing frees, else left whole, pending, for a later run. 0 turns it off. Sharing itself writes no data and is not limited' -r -f
complete -c dedupscan -n "__fish_dedupscan_needs_command" -l full-plan-days -d 'Plan every file again, not only what changed, when the last run that did is more than DAYS days old. Sharing that something undid without changing the files (`btrfs filesystem defragment` rewrites extents unshared and leaves the files\' times) is then found again, and destinations the kernel refused are retried. Reads no file data: the files planned are mapped, and only what is no longer shared is submitted. 0: never' -r -f
complete -c dedupscan -n "__fish_dedupscan_needs_command" -l db -d 'Database file [default: /var/lib/dedupscan/<filesystem-uuid>.sqlite as root, $XDG_STATE_HOME/dedupscan/<filesystem-uuid>.sqlite otherwise]' -r -F
complete -c dedupscan -n "__fish_dedupscan_needs_command" -l log-level -d 'How chatty stderr is when neither -v nor -q is given' -r -f -a "quiet\t'The final report and fatal errors only'
normal\t'Also a warning per problem path and a line per phase (default)'
verbose\t'Also details of every phase'"
complete -c dedupscan -n "__fish_dedupscan_needs_command" -l progress -d 'Progress display on stderr: bars on a terminal (auto), always, or never' -r -f -a "auto\t'Bars on a terminal, log lines elsewhere'
always\t'Bars, even when stderr is not a terminal'
never\t'Plain log lines with a rate and, once known, an ETA'"
complete -c dedupscan -n "__fish_dedupscan_needs_command" -l incremental -d 'Rehash only files whose size, mtime or ctime changed since the last run (the default: a rerun, also after an interrupted run, carries on where the database stands). Kept for scripts that say so'
complete -c dedupscan -n "__fish_dedupscan_needs_command" -l rehash -d 'Rehash every file, even those unchanged since the last run, and plan every duplicate again (not only those involving new files)'
complete -c dedupscan -n "__fish_dedupscan_needs_command" -l include-readonly-snapshots -d 'Also share into read-only btrfs snapshots (left alone by default, a path given inside one too: sharing into many snapshots can grow metadata instead of freeing space)'
complete -c dedupscan -n "__fish_dedupscan_needs_command" -l include-nocow -d 'Also share btrfs files marked NOCOW (\'chattr +C\', left alone by default: a shared extent is copied on its next write, the rewriting NOCOW was set to avoid). For images no longer written, such as the golden images of a VM store kept in a NOCOW directory. They are shared only with each other (btrfs refuses to mix them with files that keep data checksums)'
complete -c dedupscan -n "__fish_dedupscan_needs_command" -l share-across-owners -d 'Also share files of different owners. By default a file is shared only with files of the same owner: sharing is visible to a file\'s owner (FIEMAP), so a user could otherwise confirm a guess at the content of a file they cannot read'
complete -c dedupscan -n "__fish_dedupscan_needs_command" -l drop-cache -d 'Drop file data from the page cache once it is hashed, so a scan does not evict the server\'s working set (used by the systemd unit; costs rereads when ranges are shared, which then run on more workers)'
complete -c dedupscan -n "__fish_dedupscan_needs_command" -s n -l dry-run -d 'Show what would be shared, verified byte for byte, and change nothing on the volume'
complete -c dedupscan -n "__fish_dedupscan_needs_command" -l share-snapshotted -d 'btrfs: also share into files whose extents a read-only snapshot (or another file outside the run) still keeps, and turn into holes the written zeros such a snapshot also holds (copying the data that shares their extent first, within --keep-free). Nothing is freed until those snapshots are deleted, and sharing adds metadata meanwhile; by default such files wait, counted as pending. Meant for rotating snapshots (snapper, timeshift), where every old extent is always kept by the newest snapshot and would otherwise wait forever'
complete -c dedupscan -n "__fish_dedupscan_needs_command" -l keep-zeros -d 'Leave written zero blocks as they are. By default runs of at least 64 KiB of zeros (thick-provisioned images, files preallocated by writing zeros) become holes: the kernel compares them with zeros first, and the file reads the same. Zeros reflinked copies share are punched in every file holding them (on btrfs only where every holder is in the run; with data in their extent, that data is copied once and shared into every holder)'
complete -c dedupscan -n "__fish_dedupscan_needs_command" -l list -d 'Also list every planned range (source, destination, offsets, bytes): with --dry-run, what would be shared'
complete -c dedupscan -n "__fish_dedupscan_needs_command" -l json -d 'Print the report as one JSON document on stdout'
complete -c dedupscan -n "__fish_dedupscan_needs_command" -s v -l verbose -d 'More detail (repeatable); every warning about a single path, not only the first 200 of a run'
complete -c dedupscan -n "__fish_dedupscan_needs_command" -s q -l quiet -d 'Less output: no per-path warnings, no progress'
complete -c dedupscan -n "__fish_dedupscan_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dedupscan -n "__fish_dedupscan_needs_command" -s V -l version -d 'Print version'
complete -c dedupscan -n "__fish_dedupscan_needs_command" -a "scan" -d 'Only crawl and hash into the database; share nothing'
complete -c dedupscan -n "__fish_dedupscan_needs_command" -a "report" -d 'Print what the database knows: files, bytes shared, not yet shared and pinned (btrfs), and the history of runs'
complete -c dedupscan -n "__fish_dedupscan_needs_command" -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c dedupscan -n "__fish_dedupscan_using_subcommand scan" -l block-size -d 'Block size for fingerprints: a power of two from 4K to 1M (suffixes K, M). At least the filesystem\'s own block size: XFS made with 16K or 64K blocks shares whole blocks of that size only, so those are used' -r -f
complete -c dedupscan -n "__fish_dedupscan_using_subcommand scan" -l threads -d 'Hashing threads [default: 8 per CPU, 8 to 64: most wait on the disk]' -r -f
complete -c dedupscan -n "__fish_dedupscan_using_subcommand scan" -l exclude -d 'Leave out paths matching this glob (repeatable; matched on the full path, so it starts with \'/\' or \'*\', e.g. \'**/*.qcow2\' or \'/srv/tmp/**\'). A glob that matches nothing is warned about' -r -f
complete -c dedupscan -n "__fish_dedupscan_using_subcommand scan" -l exclude-from -d 'Read more exclude globs from FILE, one per line (\'#\' starts a comment)' -r -F
complete -c dedupscan -n "__fish_dedupscan_using_subcommand scan" -l max-runtime -d 'Stop cleanly when this much time is spent (e.g. 90m, 2h); work done is committed, the exit status is 5 and the next run carries on' -r -f
complete -c dedupscan -n "__fish_dedupscan_using_subcommand scan" -l metrics-file -d 'After the run, write its figures in the Prometheus text format to this file (replaced atomically), e.g. for node_exporter\'s textfile collector: /var/lib/prometheus/node-exporter/dedupscan-srv.prom' -r -F
complete -c dedupscan -n "__fish_dedupscan_using_subcommand scan" -l db -d 'Database file [default: /var/lib/dedupscan/<filesystem-uuid>.sqlite as root, $XDG_STATE_HOME/dedupscan/<filesystem-uuid>.sqlite otherwise]' -r -F
complete -c dedupscan -n "__fish_dedupscan_using_subcommand scan" -l log-level -d 'How chatty stderr is when neither -v nor -q is given' -r -f -a "quiet\t'The final report and fatal errors only'
normal\t'Also a warning per problem path and a line per phase (default)'
verbose\t'Also details of every phase'"
complete -c dedupscan -n "__fish_dedupscan_using_subcommand scan" -l progress -d 'Progress display on stderr: bars on a terminal (auto), always, or never' -r -f -a "auto\t'Bars on a terminal, log lines elsewhere'
always\t'Bars, even when stderr is not a terminal'
never\t'Plain log lines with a rate and, once known, an ETA'"
complete -c dedupscan -n "__fish_dedupscan_using_subcommand scan" -l incremental -d 'Rehash only files whose size, mtime or ctime changed since the last run (the default: a rerun, also after an interrupted run, carries on where the database stands). Kept for scripts that say so'
complete -c dedupscan -n "__fish_dedupscan_using_subcommand scan" -l rehash -d 'Rehash every file, even those unchanged since the last run, and plan every duplicate again (not only those involving new files)'
complete -c dedupscan -n "__fish_dedupscan_using_subcommand scan" -l include-readonly-snapshots -d 'Also share into read-only btrfs snapshots (left alone by default, a path given inside one too: sharing into many snapshots can grow metadata instead of freeing space)'
complete -c dedupscan -n "__fish_dedupscan_using_subcommand scan" -l include-nocow -d 'Also share btrfs files marked NOCOW (\'chattr +C\', left alone by default: a shared extent is copied on its next write, the rewriting NOCOW was set to avoid). For images no longer written, such as the golden images of a VM store kept in a NOCOW directory. They are shared only with each other (btrfs refuses to mix them with files that keep data checksums)'
complete -c dedupscan -n "__fish_dedupscan_using_subcommand scan" -l share-across-owners -d 'Also share files of different owners. By default a file is shared only with files of the same owner: sharing is visible to a file\'s owner (FIEMAP), so a user could otherwise confirm a guess at the content of a file they cannot read'
complete -c dedupscan -n "__fish_dedupscan_using_subcommand scan" -l drop-cache -d 'Drop file data from the page cache once it is hashed, so a scan does not evict the server\'s working set (used by the systemd unit; costs rereads when ranges are shared, which then run on more workers)'
complete -c dedupscan -n "__fish_dedupscan_using_subcommand scan" -l json -d 'Print the report as one JSON document on stdout'
complete -c dedupscan -n "__fish_dedupscan_using_subcommand scan" -s v -l verbose -d 'More detail (repeatable); every warning about a single path, not only the first 200 of a run'
complete -c dedupscan -n "__fish_dedupscan_using_subcommand scan" -s q -l quiet -d 'Less output: no per-path warnings, no progress'
complete -c dedupscan -n "__fish_dedupscan_using_subcommand scan" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dedupscan -n "__fish_dedupscan_using_subcommand report" -l html -d 'Also write the report as one self-contained HTML page to FILE: savings history, space now, where duplicates remain (no script, nothing fetched)' -r -F
complete -c dedupscan -n "__fish_dedupscan_using_subcommand report" -l db -d 'Database file [default: /var/lib/dedupscan/<filesystem-uuid>.sqlite as root, $XDG_STATE_HOME/dedupscan/<filesystem-uuid>.sqlite otherwise]' -r -F
complete -c dedupscan -n "__fish_dedupscan_using_subcommand report" -l log-level -d 'How chatty stderr is when neither -v nor -q is given' -r -f -a "quiet\t'The final report and fatal errors only'
normal\t'Also a warning per problem path and a line per phase (default)'
verbose\t'Also details of every phase'"
complete -c dedupscan -n "__fish_dedupscan_using_subcommand report" -l progress -d 'Progress display on stderr: bars on a terminal (auto), always, or never' -r -f -a "auto\t'Bars on a terminal, log lines elsewhere'
always\t'Bars, even when stderr is not a terminal'
never\t'Plain log lines with a rate and, once known, an ETA'"
complete -c dedupscan -n "__fish_dedupscan_using_subcommand report" -l list -d 'Also list every duplicate range the database knows (source, destination, offsets, bytes) and whether it is shared now'
complete -c dedupscan -n "__fish_dedupscan_using_subcommand report" -l json -d 'Print the report as one JSON document on stdout'
complete -c dedupscan -n "__fish_dedupscan_using_subcommand report" -s v -l verbose -d 'More detail (repeatable); every warning about a single path, not only the first 200 of a run'
complete -c dedupscan -n "__fish_dedupscan_using_subcommand report" -s q -l quiet -d 'Less output: no per-path warnings, no progress'
complete -c dedupscan -n "__fish_dedupscan_using_subcommand report" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dedupscan -n "__fish_dedupscan_using_subcommand help; and not __fish_seen_subcommand_from scan report help" -f -a "scan" -d 'Only crawl and hash into the database; share nothing'
complete -c dedupscan -n "__fish_dedupscan_using_subcommand help; and not __fish_seen_subcommand_from scan report help" -f -a "report" -d 'Print what the database knows: files, bytes shared, not yet shared and pinned (btrfs), and the history of runs'
complete -c dedupscan -n "__fish_dedupscan_using_subcommand help; and not __fish_seen_subcommand_from scan report help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
