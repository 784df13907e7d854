"""Hosts emulated on one machine in Linux network namespaces: shaped links (``netns``), commands run "on" a host
(``netns_agent``), the link check between two hosts (``linkprobe``), and chaos hosts with their own sshd that can be
killed, cut off and brought back (``chaos_netns``)."""
