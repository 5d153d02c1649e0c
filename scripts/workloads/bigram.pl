#!/usr/bin/perl
# Counts word pairs of a text in a Perl hash (about a million keys for the suite's corpus), then
# prints how many there are and the most frequent: a hash-heavy interpreter heap.
use strict;
use warnings;

my %c;
while (my $line = <>) {
    my $p = "";
    for my $w (split " ", $line) {
        $c{"$p $w"}++;
        $p = $w;
    }
}
my ($best, $n) = ("", 0);
while (my ($k, $v) = each %c) {
    ($best, $n) = ($k, $v) if $v > $n || ($v == $n && $k lt $best);
}
print scalar(keys %c), " pairs; most frequent: '$best' $n\n";
